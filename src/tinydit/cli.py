"""The ``tinydit`` command: each subcommand parses its flags, builds a config and calls one function of
``tinydit.api``; everything it does is one call from Python.

    tinydit train   --data shapes|fashion-mnist|cifar10|PATH --model dit|mmdit --preset NAME --minutes M --out DIR
    tinydit sample  --checkpoint FILE --n N --sampler NAME --steps S --cfg G --out FILE.png|FILE.npz|DIR
                    [--class NAME ... | --prompt TEXT ...]
    tinydit eval    --checkpoint FILE | --samples FILE.npz|DIR  --data fashion-mnist|shapes --n N --out DIR
    tinydit sweep   --checkpoint FILE --samplers euler,heun --steps 4,8,16 --cfg 1,2 --n N --out DIR
    tinydit presets
    tinydit report  RUN_DIR
    tinydit export  --checkpoint FILE --format onnx|pt2|web|safetensors --out FILE|DIR

Several processes: ``torchrun --nproc_per_node N -m tinydit -- train|sample|eval ...`` (any torchrun
options, several machines too; the ``--`` keeps torchrun from reading ``--n`` as its ``--nnodes``), or
``--nproc N`` on one machine, which calls torchrun for you.

The train flags are made from ``TrainConfig``'s fields, their types, defaults and the comment beside
each; their choices are the library's own constants. Library errors name parameters in backticks
(`steps`); ``main`` prints the flag of the command in their place (--steps): one line, exit status 2.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import shlex
import sys
import warnings
from dataclasses import MISSING, fields

from tinydit import api, distributed
from tinydit.config import (
    COMPILE_CHOICES,
    CONDS,
    EVAL_BUDGETS,
    FEW_STEP,
    FIXED_STEP_SAMPLERS,
    GRID_NAMES,
    MLPS,
    MODEL_CONDS,
    NORMS,
    POSITIONS,
    PRECISION_CHOICES,
    PREDICTIONS,
    SAMPLER_NAMES,
    T_SAMPLINGS,
    TrainConfig,
)
from tinydit.errors import TinyDiTError
from tinydit.version import __version__

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

# The values each TrainConfig field takes, from the library's constants (argparse lists them in --help).
TRAIN_CHOICES = {"model": tuple(MODEL_CONDS), "cond": CONDS, "t_sampling": T_SAMPLINGS, "few_step": FEW_STEP,
                 "teacher_sampler": FIXED_STEP_SAMPLERS, "precision": PRECISION_CHOICES, "compile": COMPILE_CHOICES,
                 "norm": NORMS, "mlp": MLPS, "pos": POSITIONS, "pred": PREDICTIONS,
                 "eval_budget": EVAL_BUDGETS}  # fmt: skip
# How --help groups the train flags: a field not named here is a general option.
TRAIN_GROUPS = {
    "distillation (few_step distill; the student copies the teacher's architecture)":
        ("teacher", "teacher_sampler", "teacher_steps", "teacher_cfg", "teacher_cfg_interval", "distill_paths"),
    "architecture switches (default: the preset's; see the Architecture ablation notes of the guide)":
        ("norm", "qk_norm", "mlp", "pos", "pred"),
    "logging, samples and checkpoints": ("log_every", "val_every", "val_size", "sample_every", "ckpt_every",
                                         "sample_steps", "sample_cfg", "tensorboard", "report"),
    "evaluation during training (offline metrics; best.pt)": ("eval_every", "eval_n", "eval_budget", "best_metric"),
}  # fmt: skip


def field_comments(cls: type) -> dict[str, str]:
    """The comment of each dataclass field: the one on its line, after any comment lines just above it."""
    comments, above = {}, []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        m = re.match(r"(\w+): [^=]+=[^#]*(?:#\s*(.*))?$", stripped)
        if m:
            comments[m[1]] = " ".join([*above, m[2] or ""]).strip()
        above = []
    return comments


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"use on or off, got {text!r}")
    return text == "on"


def add_config_flags(p: argparse.ArgumentParser, cls: type, choices: dict, groups: dict) -> None:
    """One flag per field of the dataclass ``cls``: ``--batch-size`` for ``batch_size``, typed from its
    annotation, with its default, its comment as help and ``choices`` where given."""
    comments = field_comments(cls)
    group_of = {name: title for title, names in groups.items() for name in names}
    made = {title: p.add_argument_group(title) for title in groups}
    for f in fields(cls):
        kind = (f.type.__name__ if isinstance(f.type, type) else str(f.type)).replace(" | None", "")
        default = f.default if f.default is not MISSING else f.default_factory()
        help_ = comments.get(f.name, "").replace("%", "%%")  # argparse formats help with %
        kw: dict = {"dest": f.name, "default": default, "help": help_ or None}
        if kind == "bool" and "None" not in str(f.type):  # a plain switch: --name, or --no-name where it is on
            name = f.name.replace("_", "-")
            kw.pop("default")
            flag = f"--no-{name}" if default else f"--{name}"
            kw.update(action="store_false" if default else "store_true", default=default)
            (made[group_of[f.name]] if f.name in group_of else p).add_argument(flag, **kw)
            continue
        if kind == "bool":  # on, off, or None: the preset's choice
            kw.update(type=_on_off, metavar="{on,off}")
        elif kind.startswith("tuple["):
            kw.update(type=float, nargs=2, metavar=("LO", "HI"))
        else:
            kw["type"] = {"int": int, "float": float, "str": str}[kind]
        if f.name in choices:
            kw["choices"] = list(choices[f.name])
        (made[group_of[f.name]] if f.name in group_of else p).add_argument("--" + f.name.replace("_", "-"), **kw)


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a DiT or an MMDiT (re-running the same command continues the run)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_config_flags(p, TrainConfig, TRAIN_CHOICES, TRAIN_GROUPS)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="insist on continuing RUN_DIR/checkpoint.pt")
    group.add_argument("--overwrite", action="store_true", help="start afresh even if RUN_DIR holds a run")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar (logs still go to metrics.jsonl)")
    _add_nproc(p)
    p.set_defaults(func=cmd_train)


def _add_nproc(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=None,
                   help="run as N processes on this machine (DDP: one per GPU, or CPU processes with gloo), "
                        "through torchrun --standalone; for several machines call torchrun yourself")


def _add_sampler_args(p: argparse.ArgumentParser, steps: bool = True) -> None:
    """The sampler settings shared by `sample`, `eval` and `sweep` (checked by the library, not argparse,
    so a bad value is one clear line)."""
    if steps:
        p.add_argument("--sampler", default=None,
                       help=f"{' | '.join(SAMPLER_NAMES)} (the guide's Sampling page); default: the checkpoint's "
                            "recorded settings, for this and every sampler flag not given")
        p.add_argument("--steps", type=int, default=None,
                       help="steps of a fixed-step sampler (heun and midpoint evaluate twice per step); "
                            "dopri5: sets only its first trial step")
    p.add_argument("--grid", default=None, help=f"time grid: {' | '.join(GRID_NAMES)} (SD3's, see --shift)")
    p.add_argument("--shift", type=float, default=None,
                   help="shift of the shifted grid, > 1 favours the noise end; None: 3, as in SD3")
    p.add_argument("--cfg-interval", type=float, nargs=2, metavar=("LO", "HI"), default=None,
                   help="apply guidance only for LO <= t <= HI (t = 1 is noise); conditional only elsewhere")
    if steps:
        p.add_argument("--rtol", type=float, default=None, help="dopri5's relative tolerance; None: 1e-3")
        p.add_argument("--atol", type=float, default=None, help="dopri5's absolute tolerance; None: 1e-3")
        p.add_argument("--eta", type=float, default=None,
                       help="the ancestral sampler's fresh noise per step, 0 (Euler) to 1 (DDPM's); None: 1")


SAMPLER_OPTIONS = ("grid", "shift", "cfg_interval", "rtol", "atol", "eta")


def _options(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in SAMPLER_OPTIONS if hasattr(args, k)}


def _add_sample(sub) -> None:
    p = sub.add_parser("sample", help="generate images from a checkpoint",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _add_model_source(p)
    p.add_argument("--class", dest="classes", action="append", default=None,
                   help="class models: class name or id (repeat, or comma-separate); default: cycle through all")
    p.add_argument("--prompt", dest="prompts", action="append", default=None,
                   help="text models: a caption to draw; repeat for several, one grid row each; default: the "
                        "prompts of the run's sample grids")
    p.add_argument("--n", type=int, default=None, help="number of images (default 64); text models: images per "
                                                       "prompt (default 8)")
    p.add_argument("--unconditional", action="store_true",
                   help="images of no class or caption (the null label, the empty caption); an empty --prompt "
                        "is refused without it")
    p.add_argument("--cfg", dest="cfg_scale", type=float, default=None, help="classifier-free guidance scale (1 = off)")
    _add_sampler_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="samples.png", help="FILE.png (a grid), FILE.npz or a directory of PNGs")
    p.add_argument("--nrow", type=int, default=None,
                   help="images per grid row (default: the number of classes; text models: --n, one row per prompt)")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-ema", dest="ema", action="store_false", help="use the raw weights instead of the EMA")
    p.add_argument("--precision", default="auto", choices=list(PRECISION_CHOICES),
                   help="auto: bf16 on CUDA and on CPUs with native bf16, else fp32")
    p.add_argument("--compile", default="auto", choices=list(COMPILE_CHOICES),
                   help="torch.compile the model for sampling; auto: on for CUDA only")
    _add_nproc(p)
    p.set_defaults(func=cmd_sample)


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="FID, KID, precision/recall, class consistency and (shapes text runs) "
                                    "prompt adherence, offline",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="generate --n samples from this checkpoint (or pretrained folder) and "
                                          "evaluate them")  # fmt: skip
    src.add_argument("--pretrained", default=None, metavar="NAME", help=PRETRAINED_HELP)
    src.add_argument("--samples", help="evaluate existing samples: an .npz (images, labels) or a folder of images")
    p.add_argument("--data", default=None,
                   help="reference: fashion-mnist | shapes | cifar10 | image folder (default: the checkpoint's)")
    p.add_argument("--split", default="test", choices=["test", "train"], help="reference split")
    p.add_argument("--data-root", dest="data_root", default="data")
    p.add_argument("--n", type=int, default=10000, help="samples to generate (with --checkpoint)")
    p.add_argument("--cfg", dest="cfg_scale", type=float, default=None, help="guidance scale (with --checkpoint)")
    _add_sampler_args(p)  # with --checkpoint
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--out", required=True, help="directory for metrics.json, report.md and a sample grid")
    p.add_argument("--inception", action="store_true", help="also compute standard Inception FID (downloads weights)")
    p.add_argument("--inception-weights", default=None, help="local FID Inception weights (implies --inception)")
    p.add_argument("--cache-dir", default=str(api.DEFAULT_CACHE), help="where reference features are cached")
    _add_nproc(p)
    p.set_defaults(func=cmd_eval)


def _add_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="quality against model evaluations across samplers, steps and guidance",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint.pt of a fashion-mnist or shapes run (class or text)")
    p.add_argument("--samplers", default="euler,heun", help=f"comma-separated: {', '.join(SAMPLER_NAMES)}")
    p.add_argument("--steps", default="4,8,16,32", help="comma-separated step counts (fixed-step samplers)")
    p.add_argument("--tols", default="1e-2,1e-3", help="comma-separated tolerances, rtol = atol (dopri5)")
    p.add_argument("--cfg", dest="cfgs", default="1,2", help="comma-separated guidance scales (1 = off)")
    _add_sampler_args(p, steps=False)
    p.add_argument("--n", type=int, default=1000, help="samples per setting (the same noise for every setting)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="test", choices=["test", "train"], help="reference split")
    p.add_argument("--data-root", dest="root", default="data")
    p.add_argument("--cache-dir", default=str(api.DEFAULT_CACHE), help="where reference features are cached")
    p.add_argument("--batch-size", type=int, default=256, help="images per forward pass")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-ema", dest="ema", action="store_false", help="use the raw weights instead of the EMA")
    p.add_argument("--out", required=True, help="directory for sweep.csv, sweep.md, sweep.json and sweep.png")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument("--apply", action="store_true",
                   help="record the best setting within --max-nfe in the checkpoint: sample and eval then use it")
    p.add_argument("--max-nfe", type=float, default=20, help="with --apply: model evaluations per image at most")
    p.set_defaults(func=cmd_sweep)


def _command(args: argparse.Namespace) -> str:
    return "tinydit " + " ".join(shlex.quote(a) for a in args.argv)


def cmd_train(args: argparse.Namespace) -> int:
    config = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    api.train(config, overwrite=args.overwrite, resume=args.resume, progress=args.progress)
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    res = api.sample(_checkpoint(args), args.n, args.classes, args.prompts, sampler=args.sampler, steps=args.steps,
                     cfg_scale=args.cfg_scale, seed=args.seed, out=args.out, nrow=args.nrow, device=args.device,
                     precision=args.precision, compile=args.compile, ema=args.ema, progress=True,
                     unconditional=args.unconditional, **_options(args))  # fmt: skip
    if not _main_rank():
        return 0
    print(res.note, file=sys.stderr)
    print(f"wrote {len(res.x)} samples to {res.path} ({res.settings['sampler']}, {res.nfe:g} model evaluations per "
          f"image, {res.seconds:.1f} s)", file=sys.stderr)  # fmt: skip
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    metrics = api.evaluate(_checkpoint(args), args.samples, out=args.out, data=args.data, n=args.n,
                           sampler=args.sampler, steps=args.steps, cfg_scale=args.cfg_scale, seed=args.seed,
                           split=args.split, data_root=args.data_root, device=args.device, inception=args.inception,
                           inception_weights=args.inception_weights, cache_dir=args.cache_dir,
                           command=_command(args), progress=True, **_options(args))  # fmt: skip
    if not _main_rank():
        return 0
    print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, dict)}, indent=2))
    print(f"wrote {args.out}/metrics.json and {args.out}/report.md", file=sys.stderr)
    return 0


def parse_list(text: str, kind: type, flag: str) -> list:
    """'4,8,16' -> [4, 8, 16] of ``kind``; a clear error naming ``flag`` otherwise."""
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    try:
        values = [kind(item) for item in items]
    except ValueError:
        example = {int: "4,8,16", float: "1,2,3"}.get(kind, "euler,heun")
        raise TinyDiTError(f"{flag} takes a comma-separated list such as {example}, got {text!r}") from None
    if not values:
        raise TinyDiTError(f"{flag} is empty; give at least one value")
    return values


def cmd_sweep(args: argparse.Namespace) -> int:
    rows = api.sweep(args.checkpoint, args.out, samplers=parse_list(args.samplers, str, "--samplers"),
                     steps=parse_list(args.steps, int, "--steps"), cfgs=parse_list(args.cfgs, float, "--cfg"),
                     tols=parse_list(args.tols, float, "--tols"), n=args.n, seed=args.seed, device=args.device,
                     split=args.split, root=args.root, cache_dir=args.cache_dir, batch_size=args.batch_size,
                     ema=args.ema, progress=args.progress, command=_command(args), apply=args.apply,
                     max_nfe=args.max_nfe, **_options(args))  # fmt: skip
    with open(f"{args.out}/sweep.md") as f:
        print(f.read(), end="")
    print(f"wrote {len(rows)} rows to {args.out}/sweep.csv, sweep.json and sweep.png", file=sys.stderr)
    if args.apply:
        print(f"recorded in {args.checkpoint}: {api.sampling_note(args.checkpoint)}", file=sys.stderr)
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    print(f"{'preset':10} {'params':>8} {'+text':>8} {'dim':>5} {'depth':>5} {'heads':>5} {'patch':>5} "
          f"{'tokens@32':>9}  switches")  # fmt: skip
    for r in api.presets():
        params = f"{r['params'] / 1e6:7.2f}M" if r["params"] is not None else f"{'-':>8}"
        depth = f"{r['depth']:5}" if r["model"] == "dit" else f"{r['depth']}+{r['single_blocks']:<3}"
        switches = " ".join(f"{k}={v}" for k, v in r["switches"].items()) or "-"
        mark = ("  (default)" if r["model"] == "dit" else "  (default for --model mmdit)") if r["default"] else ""
        mark += f"  (default on {', '.join(r['default_on'])})" if r["default_on"] else ""
        print(f"{r['preset']:10} {params} {r['params_text'] / 1e6:7.2f}M {r['dim']:5} {depth} {r['n_heads']:5} "
              f"{r['patch_size']:5} {r['tokens_at_32']:9}  {switches}{mark}")  # fmt: skip
    print("params: class-conditional, 32x32 RGB, 10 classes; +text: with the text encoder, on the shapes captions. "
          "mmdit depth: joint + single-stream blocks.")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    path = api.export(_checkpoint(args), args.format, args.out, ema=args.ema, ort_web=args.ort_web, dtype=args.dtype,
                      metrics=args.metrics, about=args.about)  # fmt: skip
    hint = f"; serve it with: python -m http.server --directory {path}" if args.format == "web" else ""
    print(f"wrote {path}{hint}", file=sys.stderr)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    print(f"wrote {api.report(args.run_dir)}", file=sys.stderr)
    return 0


# argparse takes "-1e-3" for a flag (its pattern for negative numbers has no exponent), so `--lr -1e-3`
# would fail as "expected one argument" instead of reaching the library's check of the value.
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|nan)$", re.IGNORECASE)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER


PRETRAINED_HELP = "a reference model shipped with tinydit (shapes, ...): sample it without training"


def _add_model_source(p: argparse.ArgumentParser) -> None:
    """--checkpoint, or --pretrained NAME: one of them."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help=CHECKPOINT_HELP)
    src.add_argument("--pretrained", default=None, metavar="NAME", help=PRETRAINED_HELP)


def _checkpoint(args: argparse.Namespace):
    """The checkpoint a command reads: --checkpoint, or the folder of --pretrained NAME."""
    return api.pretrained(args.pretrained) if getattr(args, "pretrained", None) else args.checkpoint


CHECKPOINT_HELP = ("checkpoint.pt written by `tinydit train`, its run directory, or a pretrained folder "
                   "(`tinydit export --format safetensors`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tinydit", description="Flow-matching Diffusion Transformers on small images")
    parser.add_argument("--version", action="version", version=f"tinydit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_train(sub)
    _add_sample(sub)
    _add_eval(sub)
    _add_sweep(sub)
    sub.add_parser("presets", help="list the model size presets").set_defaults(func=cmd_presets)
    p = sub.add_parser("export", help="the model as safetensors weights to share, ONNX, a torch.export program, "
                                      "or a page that samples in a browser")  # fmt: skip
    _add_model_source(p)
    p.add_argument("--format", required=True,
                   help="safetensors (a folder to share: weights, config.json, model card) | onnx (FILE.onnx) | "
                        "pt2 (FILE.pt2) | web (a folder)")  # fmt: skip
    p.add_argument("--out", required=True, help="the folder (safetensors, web), or FILE.onnx, FILE.pt2")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="safetensors: the weights' type (bfloat16 halves the file)")
    p.add_argument("--metrics", default=None,
                   help="safetensors: an evaluation's metrics.json for the model card (default: the run's own "
                        "evaluation at the checkpoint's step, if --eval-every made one)")  # fmt: skip
    p.add_argument("--about", default=None,
                   help="safetensors: a line for the model card (how and where it was trained)")
    p.add_argument("--no-ema", dest="ema", action="store_false", help="export the raw weights instead of the EMA")
    p.add_argument("--ort-web", default=None,
                   help="web: the dist folder of the npm package onnxruntime-web "
                        "(default: node_modules/ here or above)")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("report", help="write RUN_DIR/report.html: config, curves, evaluations and samples of a run")
    p.add_argument("run_dir", help="the run directory (`tinydit train --out`)")
    p.set_defaults(func=cmd_report)
    return parser


def flags_of(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """Parameter name -> the flag that sets it in ``command`` (``cfg_scale`` -> ``--cfg`` in sample)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    flags = {a.dest: a.option_strings[0] for a in sub._actions if a.option_strings and a.dest != "help"}
    if "cfgs" in flags:  # sweep: --cfg holds a list of guidance scales, each checked as `cfg_scale`
        flags["cfg_scale"] = flags["cfgs"]
    return flags


def as_flags(message: str, flags: dict[str, str]) -> str:
    """A library message with each `param` replaced by its flag (or by its bare name where it has none)."""
    return re.sub(r"`(\w+)`", lambda m: flags.get(m[1], m[1]), message)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line each, without source lines: they are meant for users."""
    print(f"tinydit: warning: {_FLAGS and as_flags(str(message), _FLAGS) or message}", file=sys.stderr)


_FLAGS: dict[str, str] = {}  # the running command's flags, for warnings


def _main_rank() -> bool:
    return int(os.environ.get("RANK", "0")) == 0 if distributed.launched() else True


def launch(nproc: int, argv: list[str]) -> int:
    """``tinydit CMD --nproc N ...``: the same command as N processes, started by torchrun on this machine."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    rest, skip = [], False
    for a in argv:  # the command without --nproc N / --nproc=N
        if skip or a.startswith("--nproc="):
            skip = False
            continue
        skip = a == "--nproc"
        if not skip:
            rest.append(a)
    try:
        # "--": torchrun would read abbreviations of its own flags (--n for --nnodes) past the module name
        torchrun(["--standalone", f"--nproc_per_node={nproc}", "-m", "tinydit", "--", *rest])
    except ChildFailedError as err:  # torchrun has printed each failed rank's error above
        print(f"tinydit {argv[0]}: error: {len(err.failures)} of {nproc} processes failed "
              f"(first: rank {min(err.failures)}, exit status {err.get_first_failure()[1].exitcode})", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    global _FLAGS
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv  # recorded in reports as the exact command
    _FLAGS = flags_of(parser, args.command)
    nproc = getattr(args, "nproc", None)
    if nproc is not None:
        if nproc < 1:
            parser.error(f"--nproc must be >= 1, got {nproc}")
        if distributed.launched():
            parser.error("--nproc starts processes through torchrun, and this one already is one: drop --nproc")
        return launch(nproc, argv)
    rank = f" (rank {os.environ['RANK']})" if distributed.launched() and os.environ["WORLD_SIZE"] != "1" else ""
    try:
        with warnings.catch_warnings():  # restores the warning hooks afterwards
            warnings.simplefilter("default")
            warnings.showwarning = _show_warning
            return args.func(args)
    except TinyDiTError as err:
        print(f"tinydit {args.command}{rank}: error: {as_flags(str(err), _FLAGS)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as err:  # disk full, permissions: one line, not a traceback
        print(f"tinydit {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
