"""The ``tinydit`` command: each subcommand parses its flags, builds a config and calls one function of
``tinydit.api``; everything it does is one call from Python.

    tinydit train   --data shapes|fashion-mnist|cifar10|PATH --model dit|mmdit --preset NAME --minutes M --out DIR
    tinydit sample  --checkpoint FILE --n N --sampler NAME --steps S --cfg-scale G --out FILE.png|FILE.npz|DIR
                    [--class NAME ... | --prompt TEXT ...]
    tinydit eval    --checkpoint FILE | --samples FILE.npz|DIR  --data fashion-mnist|shapes --n N --out DIR
    tinydit sweep   --checkpoint FILE --samplers euler,heun --steps 4,8,16 --cfg-scale 1,2 --n N --out DIR
    tinydit presets
    tinydit report  RUN_DIR
    tinydit export  --checkpoint FILE --format onnx|pt2|web|safetensors --out FILE|DIR

Several processes: ``torchrun --nproc_per_node N -m tinydit -- train|sample|eval ...``, or ``--nproc N``.

The flags are tables: the train flags are ``TrainConfig``'s fields (``tinydit.flags``), the other commands'
flags are ``FLAGS``, each named as the ``tinydit.api`` parameter it sets, and ``COMMANDS`` lists each
command's; each ``cmd_*`` calls its API function with every flag by name. A library error names its
parameter (`steps`); ``main`` prints the flag (--steps), one line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import fields

from tinydit import api, config, distributed
from tinydit.config import TrainConfig
from tinydit.errors import TinyDiTError
from tinydit.flags import HelpFormatter, Parser, add_config_flags, as_flags, flags_of, parse_list, user_warnings
from tinydit.version import __version__

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

# fmt: off
TRAIN_HELP = "train a DiT or an MMDiT (re-running the same command continues the run)"


CHECKPOINT_HELP = ("checkpoint.pt written by `tinydit train`, its run directory, or a pretrained folder "
                   "(`tinydit export --format safetensors`)")
# Every flag of the other commands, once: dest -> (flag or (flag, alias), argparse keywords). Sampler settings are
# checked by the library, not by argparse, so a bad value is one clear line; None: the checkpoint's recorded setting.
FLAGS: dict[str, tuple[str | tuple[str, str], dict]] = {
    "checkpoint": ("--checkpoint", dict(help=CHECKPOINT_HELP)),
    "pretrained": ("--pretrained", dict(metavar="NAME", help="a reference model shipped with tinydit (e.g. shapes)")),
    "samples": ("--samples", dict(help="evaluate existing samples: an .npz (images, labels) or a folder of images")),
    "classes": ("--class", dict(action="append", help="class models: class name or id (repeat, or comma-separate); "
                                                      "default: cycle through all")),
    "prompts": ("--prompt", dict(action="append", help="text models: a caption to draw; repeat for several, one grid "
                                                       "row each; default: the prompts of the run's sample grids")),
    "unconditional": ("--unconditional", dict(action="store_true", help="images of no class or caption (the null "
                                              "label, the empty caption); an empty --prompt is refused without it")),
    "n": ("--n", dict(type=int, help="number of images (default 64); text models: images per prompt (default 8)")),
    "cfg_scale": (("--cfg-scale", "--cfg"), dict(type=float, help="classifier-free guidance scale (1 = off)")),
    "sampler": ("--sampler", dict(help=f"{' | '.join(api.SAMPLER_NAMES)} (the guide's Sampling page); default: the "
                                       "checkpoint's recorded settings, for this and every sampler flag not given")),
    "steps": ("--steps", dict(type=int, help="steps of a fixed-step sampler (heun and midpoint evaluate twice per "
                                             "step); dopri5: sets only its first trial step")),
    "grid": ("--grid", dict(help=f"time grid: {' | '.join(api.GRID_NAMES)} (SD3's, see --shift)")),
    "shift": ("--shift", dict(type=float, help="the shifted grid's shift, > 1 favours the noise end; None: 3 (SD3)")),
    "cfg_interval": ("--cfg-interval", dict(type=float, nargs=2, metavar=("LO", "HI"), help="apply guidance only for "
                                            "LO <= t <= HI (t = 1 is noise); conditional only elsewhere")),
    "rtol": ("--rtol", dict(type=float, help="dopri5's relative tolerance; None: 1e-3")),
    "atol": ("--atol", dict(type=float, help="dopri5's absolute tolerance; None: 1e-3")),
    "eta": ("--eta", dict(type=float, help="ancestral: fresh noise per step, 0 (Euler) to 1 (DDPM's); None: 1")),
    "seed": ("--seed", dict(type=int, default=0, help="the seed of the noise and of every other random draw")),
    "trajectory": ("--trajectory", dict(action="store_true", help="also draw the first 8 images after every step, "
                                        "a row each from noise to image, into OUT_trajectory.png beside --out")),
    "nrow": ("--nrow", dict(type=int, help="images per grid row (default: the number of classes; text models: --n, "
                                           "one row per prompt)")),
    "device": ("--device", dict(default="auto", help="auto (CUDA, else Apple's MPS, else the CPU) | cpu | cuda | "
                                                     "cuda:N | mps")),
    "ema": ("--no-ema", dict(action="store_false", help="use the raw weights instead of the EMA")),
    "precision": ("--precision", dict(default="auto", choices=list(config.PRECISION_CHOICES),
                                      help="auto: bf16 on CUDA, or on a CPU probed at 1.5x fp32; else fp32")),
    "compile": ("--compile", dict(default="auto", choices=list(config.CHOICES["compile"]),
                                  help="torch.compile the model for sampling; auto: on for CUDA only")),
    "nproc": ("--nproc", dict(type=int, help="run as N processes here through torchrun --standalone (DDP: one per "
                                             "GPU, or CPU processes with gloo); for several machines call torchrun "
                                             "(default: this one process)")),
    "progress": ("--no-progress", dict(action="store_false", help="no progress bar (logs still go to metrics.jsonl)")),
    "data": ("--data", dict(help="reference: fashion-mnist | shapes | cifar10 | a folder (default: the checkpoint's)")),
    "split": ("--split", dict(default="test", choices=["test", "train"], help="reference split")),
    "data_root": ("--data-root", dict(default="data", help="where downloadable data sets are looked for")),
    "inception": ("--inception", dict(action="store_true", help="also the standard Inception FID (downloads weights)")),
    "guidance_1": ("--no-guidance-1", dict(action="store_false", help="skip the second set of samples at guidance 1 "
                      "(the model alone) that a guided evaluation reports beside its own")),
    "inception_weights": ("--inception-weights", dict(help="local FID Inception weights (implies --inception)")),
    "cache_dir": ("--cache-dir", dict(default=str(api.DEFAULT_CACHE), help="where reference features are cached")),
    "samplers": ("--samplers", dict(default="euler,heun", help=f"comma-separated: {', '.join(api.SAMPLER_NAMES)}")),
    "tols": ("--tols", dict(default="1e-2,1e-3", help="comma-separated tolerances, rtol = atol (dopri5)")),
    "cfg_scales": (("--cfg-scale", "--cfg"), dict(default="1,2", help="comma-separated guidance scales (1 = off)")),
    "batch_size": ("--batch-size", dict(type=int, default=256, help="images per forward pass")),
    "apply": ("--apply", dict(action="store_true", help="record the best setting within --max-nfe in the checkpoint: "
                                                        "sample and eval then use it")),
    "max_nfe": ("--max-nfe", dict(type=float, default=20, help="with --apply: model evaluations per image at most")),
    "format": ("--format", dict(required=True, help="safetensors (a folder to share: weights, config.json, model "
                                                    "card) | onnx (FILE.onnx) | pt2 (FILE.pt2) | web (a folder)")),
    "dtype": ("--dtype", dict(default="float32", choices=("float32", "bfloat16", "float16"),
                              help="safetensors: the weights' type (bfloat16 halves the file)")),
    "metrics": ("--metrics", dict(help="safetensors: an evaluation's metrics.json for the model card (default: the "
                                       "run's own evaluation at the checkpoint's step, if --eval-every made one)")),
    "about": ("--about", dict(help="safetensors: a line for the model card (how and where it was trained)")),
    "ort_web": ("--ort-web", dict(help="web: the dist folder of the npm package onnxruntime-web (default: "
                                       "node_modules/ here or above)")),
    "out": ("--out", dict(required=True)),
    "overwrite": ("--overwrite", dict(action="store_true", help="replace an earlier export at --out")),
    "run_dir": ("run_dir", dict(help="the run directory (`tinydit train --out`)")),
}
GRID_FLAGS = ("grid", "shift", "cfg_interval")
SAMPLER_OPTIONS = (*GRID_FLAGS, "rtol", "atol", "eta")  # passed on as a sampler's options
SAMPLER_FLAGS = ("sampler", "steps", *SAMPLER_OPTIONS)
DEVICE_FLAGS = ("device", "precision", "compile", "nproc")  # in a group of their own, as train's
MODEL_SOURCE = ("checkpoint", "pretrained")  # a tuple in a command's flags: one of them, required
# command -> (help, its flags in --help's order, its own keywords for some of them)
COMMANDS: dict[str, tuple[str, tuple, dict]] = {
    "sample": ("generate images from a checkpoint",
               (MODEL_SOURCE, "classes", "prompts", "n", "unconditional", "cfg_scale", *SAMPLER_FLAGS, "seed", "out",
                "nrow", "trajectory", "device", "ema", "precision", "compile", "nproc"),
               {"out": dict(required=False, default="samples.png",
                            help="FILE.png (a grid), FILE.npz or a directory of PNGs")}),
    "eval": ("FID, KID, precision/recall, class consistency and (shapes text runs) prompt adherence, offline",
             ((*MODEL_SOURCE, "samples"), "data", "split", "data_root", "n", "cfg_scale", *SAMPLER_FLAGS, "seed",
              "device", "out", "inception", "inception_weights", "guidance_1", "cache_dir", "nproc"),
             {"n": dict(default=10000, help="samples to generate (with --checkpoint)"),
              "checkpoint": dict(help="generate --n samples from this checkpoint (or pretrained folder) and evaluate "
                                      "them"),
              "out": dict(help="directory for metrics.json, report.md and a sample grid")}),
    "sweep": ("quality against model evaluations across samplers, steps and guidance",
              ("checkpoint", "samplers", "steps", "tols", "cfg_scales", *GRID_FLAGS, "n", "seed", "split",
               "data_root", "cache_dir", "batch_size", "device", "ema", "out", "progress", "apply", "max_nfe"),
              {"checkpoint": dict(required=True, help="checkpoint.pt of a fashion-mnist or shapes run (class or text)"),
               "steps": dict(type=str, default="4,8,16,32", help="comma-separated step counts (fixed-step samplers)"),
               "n": dict(default=1000, help="samples per setting (the same noise for every setting)"),
               "progress": dict(help="no progress bar"), "data_root": dict(dest="root"),
               "out": dict(help="directory for sweep.csv, sweep.md, sweep.json and sweep.png")}),
    "export": ("the model as safetensors weights to share, ONNX, a torch.export program, or a page that samples in a "
               "browser", (MODEL_SOURCE, "format", "out", "overwrite", "dtype", "metrics", "about", "ema", "ort_web"),
               {"out": dict(help="the folder (safetensors, web), or FILE.onnx, FILE.pt2"),
                "ema": dict(help="export the raw weights instead of the EMA")}),
    "presets": ("list the model size presets", (), {}),
    "report": ("write RUN_DIR/report.html: config, curves, evaluations and samples of a run", ("run_dir",), {}),
}
PRESETS_NOTE = ("params: class-conditional, 32x32 RGB, 10 classes; +text: with the text encoder, on the shapes "
                "captions. mmdit depth: joint + single-stream blocks.")
# fmt: on


def _add_train(sub) -> None:
    """The train flags: TrainConfig's, grouped as its fields are, and the run's own in the groups they belong to."""
    p = sub.add_parser("train", help=TRAIN_HELP, formatter_class=HelpFormatter)
    groups = add_config_flags(p, TrainConfig, api.TRAIN_CHOICES, api.TRAIN_DEFAULTS)
    run_dir = groups["output"].add_mutually_exclusive_group()
    run_dir.add_argument("--resume", action="store_true", help="insist on continuing RUN_DIR/checkpoint.pt")
    run_dir.add_argument("--overwrite", action="store_true", help="start afresh even if RUN_DIR holds a run")
    for name, group in (("progress", "output"), ("nproc", "device")):
        groups[group].add_argument(FLAGS[name][0], dest=name, **FLAGS[name][1])
    p.set_defaults(func=cmd_train)


def _add_command(sub, name: str) -> None:
    help_, names, own = COMMANDS[name]
    p = sub.add_parser(name, help=help_, formatter_class=HelpFormatter)
    device = None  # the group of the device flags, as in train, made where the command has them
    for item in names:
        if item in DEVICE_FLAGS:
            device = device or p.add_argument_group("device", "where the command computes, and how")
        group = p.add_mutually_exclusive_group(required=True) if isinstance(item, tuple) else p
        group = device if item in DEVICE_FLAGS else group
        for dest in item if isinstance(item, tuple) else (item,):
            flag, kw = FLAGS[dest]
            names = (flag,) if isinstance(flag, str) else flag
            if not names[0].startswith("-"):  # a positional argument
                group.add_argument(flag, **kw)
                continue
            kw = {"default": None, **kw, **own.get(dest, {})}
            if kw.get("action") in ("store_true", "store_false"):
                kw["default"] = kw["action"] == "store_false"
            group.add_argument(*names, **{"dest": dest, **kw})
    p.set_defaults(func=globals()[f"cmd_{name}"])


def _model(args: argparse.Namespace) -> str | None:
    """The model a command reads: --checkpoint, or the folder of --pretrained NAME (None: neither, as eval
    --samples)."""
    # "" names a model too (a blank one, which the library refuses): only None is --pretrained not given
    if getattr(args, "pretrained", None) is not None:
        return api.pretrained(args.pretrained)
    return args.checkpoint


def _sampling(args: argparse.Namespace) -> dict:
    """The sampler flags, each as the ``tinydit.api`` parameter of its name (None: the recorded setting)."""
    return dict(
        sampler=args.sampler,
        steps=args.steps,
        cfg_scale=args.cfg_scale,
        grid=args.grid,
        shift=args.shift,
        cfg_interval=args.cfg_interval,
        rtol=args.rtol,
        atol=args.atol,
        eta=args.eta,
    )


def _command(args: argparse.Namespace) -> str:
    return "tinydit " + " ".join(shlex.quote(a) for a in args.argv)


def cmd_train(args: argparse.Namespace) -> int:
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    api.train(cfg, overwrite=args.overwrite, resume=args.resume, progress=args.progress)
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    res = api.sample(
        _model(args),
        args.n,
        args.classes,
        args.prompts,
        unconditional=args.unconditional,
        **_sampling(args),
        seed=args.seed,
        out=args.out,
        nrow=args.nrow,
        trajectory=args.trajectory,
        device=args.device,
        ema=args.ema,
        precision=args.precision,
        compile=args.compile,
        progress=True,
    )
    if distributed.rank():  # rank 0 alone reports
        return 0
    cost = f"{res.settings.sampler}, {res.nfe:g} model evaluations per image, {res.seconds:.1f} s on {res.device}"
    print(f"{res.settings.note}\nwrote {len(res.x)} samples to {res.path} ({cost})", file=sys.stderr)
    if res.trajectory_path is not None:
        print(f"wrote their first images' trajectory to {res.trajectory_path}", file=sys.stderr)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    metrics = api.evaluate(
        _model(args),
        args.samples,
        out=args.out,
        data=args.data,
        n=args.n,
        **_sampling(args),
        seed=args.seed,
        split=args.split,
        data_root=args.data_root,
        device=args.device,
        inception=args.inception,
        inception_weights=args.inception_weights,
        guidance_1=args.guidance_1,
        cache_dir=args.cache_dir,
        command=_command(args),
        progress=True,
    )
    if distributed.rank():  # rank 0 alone reports
        return 0
    print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, dict)}, indent=2))
    print(f"wrote {args.out}/metrics.json and {args.out}/report.md", file=sys.stderr)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    kinds = {"samplers": str, "steps": int, "cfg_scales": float, "tols": float}  # comma-separated lists
    # an error names the parameter in backticks, which main() prints as its flag
    lists = {name: parse_list(getattr(args, name), kind, f"`{name}`") for name, kind in kinds.items()}
    rows = api.sweep(
        args.checkpoint,
        args.out,
        **lists,
        grid=args.grid,
        shift=args.shift,
        cfg_interval=args.cfg_interval,
        n=args.n,
        seed=args.seed,
        split=args.split,
        root=args.root,
        cache_dir=args.cache_dir,
        batch_size=args.batch_size,
        device=args.device,
        ema=args.ema,
        progress=args.progress,
        apply=args.apply,
        max_nfe=args.max_nfe,
        command=_command(args),
    )
    with open(f"{args.out}/sweep.md") as f:
        print(f.read(), end="")
    print(f"wrote {len(rows)} rows to {args.out}/sweep.csv, sweep.json and sweep.png", file=sys.stderr)
    if args.apply:
        where = api.sampling_target(args.checkpoint)  # a checkpoint.pt, or a pretrained folder (config.json, card)
        print(f"recorded in {where}: {api.sampling_note(args.checkpoint)}", file=sys.stderr)
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    print(f"{'preset':10} {'params':>8} {'+text':>8}   dim depth heads patch tokens@32  switches")
    for r in api.presets():
        params = f"{r['params'] / 1e6:7.2f}M" if r["params"] is not None else f"{'-':>8}"
        depth = f"{r['depth']:5}" if r["model"] == "dit" else f"{r['depth']}+{r['single_blocks']:<3}"
        switches = " ".join(f"{k}={v}" for k, v in r["switches"].items()) or "-"
        mark = ("  (default)" if r["model"] == "dit" else "  (default for --model mmdit)") if r["default"] else ""
        mark += f"  (default on {', '.join(r['default_on'])})" if r["default_on"] else ""
        shape = f"{r['dim']:5} {depth} {r['n_heads']:5} {r['patch_size']:5} {r['tokens_at_32']:9}"
        print(f"{r['preset']:10} {params} {r['params_text'] / 1e6:7.2f}M {shape}  {switches}{mark}")
    print(PRESETS_NOTE)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    path = api.export(
        _model(args),
        args.format,
        args.out,
        ema=args.ema,
        ort_web=args.ort_web,
        dtype=args.dtype,
        metrics=args.metrics,
        about=args.about,
        overwrite=args.overwrite,
    )
    hint = f"; serve it with: python -m http.server --directory {path}" if args.format == "web" else ""
    print(f"wrote {path}{hint}", file=sys.stderr)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    print(f"wrote {api.report(args.run_dir)}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tinydit", description="Flow-matching Diffusion Transformers on small images")
    parser.add_argument("--version", action="version", version=f"tinydit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    _add_train(sub)
    for name in COMMANDS:
        _add_command(sub, name)
    return parser


def _renamed(argv: list[str]) -> list[str]:
    """``tinydit train --few-step X``, the name --objective had before (none: flow), kept for a release as
    --objective, said in one line."""
    if not argv or argv[0] != "train":
        return argv
    out = []
    for i, a in enumerate(argv):
        if a == "--few-step" and i + 1 < len(argv):
            continue
        if a.startswith("--few-step=") or (i and argv[i - 1] == "--few-step"):
            value = a.removeprefix("--few-step=")
            value = "flow" if value == "none" else value
            print(f"tinydit train: --few-step is deprecated: use --objective {value}", file=sys.stderr)
            out += ["--objective", value]
        else:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = _renamed(sys.argv[1:] if argv is None else [str(a) for a in argv])
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv  # recorded in reports as the exact command
    flags = flags_of(parser, args.command)
    nproc = getattr(args, "nproc", None)
    if nproc is not None:
        if nproc < 1:
            parser.error(f"--nproc must be >= 1, got {nproc}")
        if distributed.launched():
            parser.error("--nproc starts processes through torchrun, and this one already is one: drop --nproc")
    rank = f" (rank {os.environ['RANK']})" if distributed.launched() and os.environ["WORLD_SIZE"] != "1" else ""
    try:
        with user_warnings(flags):
            if nproc is None:
                return args.func(args)
            if args.command == "train" and args.batch_size:  # refused once here, not by each process it starts
                distributed.check_split(args.batch_size, nproc)
            return distributed.launch_local(nproc, argv)
    except TinyDiTError as err:
        print(f"tinydit {args.command}{rank}: error: {as_flags(str(err), flags)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as err:  # disk full, permissions: one line, not a traceback
        print(f"tinydit {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
