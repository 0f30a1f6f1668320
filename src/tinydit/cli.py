"""The ``tinydit`` command: argument parsing only; the work is done by library functions.

    tinydit train   --data shapes|fashion-mnist|cifar10|PATH --model dit|mmdit --cond class|text --preset NAME
                    --steps N --minutes M --out RUN_DIR
    tinydit sample  --checkpoint FILE --n N --sampler NAME --steps S --cfg G --seed K --out FILE.png|FILE.npz|DIR
                    [--class NAME ... | --prompt TEXT ...]
    tinydit eval    --checkpoint FILE | --samples FILE.npz|DIR  --data fashion-mnist|shapes --n N --out DIR
    tinydit sweep   --checkpoint FILE --samplers euler,heun --steps 4,8,16 --cfg 1,2 --n N --out DIR
    tinydit presets

User mistakes print one line naming the problem and the fix, and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from tinydit.errors import TinyDiTError

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _add_train(sub: argparse._SubParsersAction) -> None:
    from tinydit.config import FEW_STEP, SHAPES_HOLDOUT, TrainConfig
    from tinydit.registry import MODEL_TYPES

    d = TrainConfig()
    p = sub.add_parser("train", help="train a DiT or an MMDiT (re-running the same command continues the run)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", default=d.data, help="shapes | fashion-mnist | cifar10 | path of an image folder")
    p.add_argument("--data-root", default=d.data_root, help="where downloadable data sets are looked for")
    p.add_argument("--limit", type=int, default=None, help="train on the first N images only")
    p.add_argument("--model", default=d.model, choices=list(MODEL_TYPES),
                   help="dit, or mmdit: image and text streams with joint attention (text-to-image, SD3)")
    p.add_argument("--cond", default=None, choices=["class", "text"],
                   help="condition on class labels or on captions; default: class for dit, text for mmdit "
                        "(--model dit --cond text sees the caption only through its pooled vector)")
    p.add_argument("--preset", default=None,
                   help="model size (see `tinydit presets`); default: "
                        + ", ".join(f"{t.default_preset} for {name}" for name, t in MODEL_TYPES.items()))
    p.add_argument("--holdout", default=None,
                   help="text runs: comma-separated caption phrases never trained on (their images are removed); "
                        f"default: {SHAPES_HOLDOUT!r} for shapes, none otherwise; 'none' for none")
    p.add_argument("--steps", type=int, default=None, help="stop after N optimizer steps (2000 if no --minutes)")
    p.add_argument("--minutes", type=float, default=None, help="stop after M minutes of training in total")
    p.add_argument("--out", default=d.out, help="run directory")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--cooldown", type=int, default=d.cooldown,
                   help="decay the learning rate linearly to 0 over the last N of --steps (0: constant to the end)")
    p.add_argument("--ema-decay", type=float, default=d.ema_decay)
    p.add_argument("--class-dropout", type=float, default=d.class_dropout)
    p.add_argument("--t-sampling", default=None, choices=["uniform", "logit-normal"],
                   help="distribution of training times (default: logit-normal for text runs, else uniform)")
    p.add_argument("--t-shift", type=float, default=d.t_shift, help="shift training times towards noise (SD3)")
    p.add_argument("--few-step", default=d.few_step, choices=list(FEW_STEP),
                   help="shortcut: also learn 1-, 2- and 4-step sampling (shortcut models); distill: train a "
                        "1-, 2-, 4- and 8-step student on a trained model's paths (--teacher); docs/few_step.md")
    distill = p.add_argument_group("distillation (--few-step distill; the student copies the teacher's architecture)")
    distill.add_argument("--teacher", default=None, help="checkpoint.pt of the trained model to distill")
    distill.add_argument("--teacher-sampler", default=d.teacher_sampler, choices=["euler", "heun", "midpoint"])
    distill.add_argument("--teacher-steps", type=int, default=d.teacher_steps,
                         help="the teacher sampler's uniform steps (a multiple of 8)")
    distill.add_argument("--teacher-cfg", type=float, default=d.teacher_cfg, help="the teacher's guidance scale")
    distill.add_argument("--teacher-cfg-interval", type=float, nargs=2, metavar=("LO", "HI"),
                         default=list(d.teacher_cfg_interval), help="the teacher's guidance interval of t")
    distill.add_argument("--distill-paths", type=int, default=d.distill_paths,
                         help="teacher paths sampled once (cached in RUN_DIR) for the student to train on")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--device", default=d.device, help="auto | cpu | cuda | cuda:N | mps")
    p.add_argument("--precision", default=d.precision, choices=["auto", "fp32", "bf16", "fp16"],
                   help="auto: bf16 on CUDA and on CPUs with native bf16 (AVX512-BF16/AMX), else fp32: "
                        "the fastest measured (benchmarks/README.md)")
    p.add_argument("--compile", default=d.compile, choices=["auto", "on", "off"],
                   help="torch.compile the forward passes; auto: on for CUDA, off for CPU (pays off there only "
                        "after about 3 minutes of training in bf16, 6 in fp32)")
    arch = p.add_argument_group("architecture switches (default: the preset's; see docs/ablation.md)")
    arch.add_argument("--norm", choices=["layernorm", "rmsnorm"], default=None)
    arch.add_argument("--qk-norm", choices=["on", "off"], default=None, help="RMS-normalise queries and keys")
    arch.add_argument("--mlp", choices=["gelu", "swiglu"], default=None)
    arch.add_argument("--pos", choices=["sincos", "rope"], default=None, help="absolute sin-cos or 2-D RoPE")
    arch.add_argument("--pred", choices=["v", "x"], default=None,
                      help="network output: the velocity (v) or the clean image (x, JiT), v derived from it")
    p.add_argument("--log-every", type=int, default=d.log_every)
    p.add_argument("--val-every", type=int, default=d.val_every)
    p.add_argument("--sample-every", type=int, default=d.sample_every)
    p.add_argument("--ckpt-every", type=int, default=d.ckpt_every)
    p.add_argument("--sample-steps", type=int, default=d.sample_steps)
    p.add_argument("--sample-cfg", type=float, default=d.sample_cfg)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="insist on continuing RUN_DIR/checkpoint.pt")
    group.add_argument("--overwrite", action="store_true", help="start afresh even if RUN_DIR holds a run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs still go to metrics.jsonl)")
    p.set_defaults(func=cmd_train)


def _add_sampler_args(p: argparse.ArgumentParser, steps: bool = True) -> None:
    """The sampler settings shared by `sample`, `eval` and `sweep` (checked by the library, not argparse,
    so a bad value is one clear line)."""
    if steps:
        p.add_argument("--sampler", default="euler",
                       help="euler | heun | midpoint | dopri5 (adaptive) | ancestral (stochastic) | heun-first (Euler, "
                            "Heun's first step); see the README")
        p.add_argument("--steps", type=int, default=32,
                       help="steps of a fixed-step sampler (heun and midpoint evaluate twice per step); "
                            "dopri5: sets only its first trial step")
    p.add_argument("--grid", default="uniform", help="time grid: uniform | shifted (SD3's, see --shift)")
    p.add_argument("--shift", type=float, default=None,
                   help="shift of the shifted grid, > 1 favours the noise end; None: 3, as in SD3")
    p.add_argument("--cfg-interval", type=float, nargs=2, metavar=("LO", "HI"), default=None,
                   help="apply guidance only for LO <= t <= HI (t = 1 is noise); conditional only elsewhere")
    if steps:
        p.add_argument("--rtol", type=float, default=None, help="dopri5's relative tolerance; None: 1e-3")
        p.add_argument("--atol", type=float, default=None, help="dopri5's absolute tolerance; None: 1e-3")
        p.add_argument("--eta", type=float, default=None,
                       help="the ancestral sampler's fresh noise per step, 0 (Euler) to 1 (DDPM's); None: 1")


def _sampler_options(args: argparse.Namespace) -> dict:
    return {"grid": args.grid, "shift": args.shift, "cfg_interval": args.cfg_interval,
            "rtol": getattr(args, "rtol", None), "atol": getattr(args, "atol", None),
            "eta": getattr(args, "eta", None)}  # fmt: skip


def _add_sample(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample", help="generate images from a checkpoint",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint.pt written by `tinydit train`")
    p.add_argument("--class", dest="classes", action="append", default=None,
                   help="class models: class name or id (repeat, or comma-separate); default: cycle through all")
    p.add_argument("--prompt", dest="prompts", action="append", default=None,
                   help="text models: a caption to draw; repeat for several, one grid row each; default: the "
                        "prompts of the run's sample grids")
    p.add_argument("--n", type=int, default=None, help="number of images (default 64); text models: images per "
                                                       "prompt (default 8)")
    p.add_argument("--cfg", type=float, default=2.0, help="classifier-free guidance scale (1 = off)")
    _add_sampler_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="samples.png", help="FILE.png (a grid), FILE.npz or a directory of PNGs")
    p.add_argument("--nrow", type=int, default=None,
                   help="images per grid row (default: the number of classes; text models: --n, one row per prompt)")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                   help="auto: bf16 on CUDA and on CPUs with native bf16, else fp32")
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"],
                   help="torch.compile the model for sampling; auto: on for CUDA only")
    p.set_defaults(func=cmd_sample)


def _add_eval(sub: argparse._SubParsersAction) -> None:
    from tinydit.evaluate import DEFAULT_CACHE

    p = sub.add_parser("eval", help="FID, KID, precision/recall, class consistency and (shapes text runs) "
                                    "prompt adherence, offline",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="generate --n samples from this checkpoint and evaluate them")
    src.add_argument("--samples", help="evaluate existing samples: an .npz (images, labels) or a folder of images")
    p.add_argument("--data", default=None,
                   help="reference: fashion-mnist | shapes | cifar10 | image folder (default: the checkpoint's)")
    p.add_argument("--split", default="test", choices=["test", "train"], help="reference split")
    p.add_argument("--data-root", default="data")
    p.add_argument("--n", type=int, default=10000, help="samples to generate (with --checkpoint)")
    p.add_argument("--cfg", type=float, default=2.0, help="guidance scale (with --checkpoint)")
    _add_sampler_args(p)  # with --checkpoint
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--out", required=True, help="directory for metrics.json, report.md and a sample grid")
    p.add_argument("--inception", action="store_true", help="also compute standard Inception FID (downloads weights)")
    p.add_argument("--inception-weights", default=None, help="local FID Inception weights (implies --inception)")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="where reference features are cached")
    p.set_defaults(func=cmd_eval)


def _add_sweep(sub: argparse._SubParsersAction) -> None:
    from tinydit.evaluate import DEFAULT_CACHE

    p = sub.add_parser("sweep", help="quality against model evaluations across samplers, steps and guidance",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint.pt of a fashion-mnist or shapes run (class or text)")
    p.add_argument("--samplers", default="euler,heun",
                   help="comma-separated: euler, heun, midpoint, dopri5, ancestral, heun-first")
    p.add_argument("--steps", default="4,8,16,32", help="comma-separated step counts (fixed-step samplers)")
    p.add_argument("--tols", default="1e-2,1e-3", help="comma-separated tolerances, rtol = atol (dopri5)")
    p.add_argument("--cfg", default="1,2", help="comma-separated guidance scales (1 = off)")
    _add_sampler_args(p, steps=False)
    p.add_argument("--n", type=int, default=1000, help="samples per setting (the same noise for every setting)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="test", choices=["test", "train"], help="reference split")
    p.add_argument("--data-root", default="data")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="where reference features are cached")
    p.add_argument("--batch-size", type=int, default=256, help="images per forward pass")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA")
    p.add_argument("--out", required=True, help="directory for sweep.csv, sweep.md, sweep.json and sweep.png")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from tinydit.sweep import parse_list, run_sweep
    from tinydit.train import resolve_device

    rows = run_sweep(
        args.checkpoint, args.out, samplers=parse_list(args.samplers, str, "--samplers"),
        steps=parse_list(args.steps, int, "--steps"), cfgs=parse_list(args.cfg, float, "--cfg"),
        tols=parse_list(args.tols, float, "--tols"), n=args.n, seed=args.seed, device=resolve_device(args.device),
        grid=args.grid, shift=args.shift, cfg_interval=args.cfg_interval, split=args.split, root=args.data_root,
        cache_dir=args.cache_dir, batch_size=args.batch_size, ema=not args.no_ema, progress=not args.no_progress,
        command="tinydit " + " ".join(shlex.quote(a) for a in args.argv),
    )  # fmt: skip
    out = Path(args.out)
    print((out / "sweep.md").read_text(), end="")
    print(f"wrote {len(rows)} rows to {out / 'sweep.csv'}, {out / 'sweep.json'} and {out / 'sweep.png'}",
          file=sys.stderr)  # fmt: skip
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import json
    import shlex
    from pathlib import Path

    from tinydit.data import load_dataset
    from tinydit.evaluate import evaluate, generate_for_eval, load_samples, to_eval_images
    from tinydit.report import write_report
    from tinydit.train import ensure_writable_dir, resolve_device

    out = Path(args.out)
    ensure_writable_dir(out)
    extra: dict = {"nfe_per_image": None, "generation_seconds": None}
    if args.checkpoint:
        images, labels, data, classes, extra = generate_for_eval(
            args.checkpoint, args.n, args.steps, args.cfg, args.seed, resolve_device(args.device), args.data,
            sampler=args.sampler, **_sampler_options(args),
        )
    else:
        if not args.data:
            raise TinyDiTError("--samples needs --data (fashion-mnist, shapes, cifar10 or a folder) for the reference")
        data = args.data
        classes = load_dataset(data, train=False, root=args.data_root, limit=1).classes
        images, labels = load_samples(args.samples, classes)
    images = to_eval_images(images, data)  # once: uint8 at the evaluation size, for the metrics and the report
    metrics = evaluate(images, labels, data, split=args.split, root=args.data_root, cache_dir=args.cache_dir,
                       inception=args.inception, inception_weights=args.inception_weights)
    metrics.update(extra)
    command = "tinydit " + " ".join(shlex.quote(a) for a in args.argv)
    report = write_report(out, metrics, command, images, labels, classes)
    print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, dict)}, indent=2))
    print(f"wrote {out / 'metrics.json'} and {report}", file=sys.stderr)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from tinydit.config import TrainConfig
    from tinydit.train import Trainer

    cfg = TrainConfig(
        out=args.out, data=args.data, data_root=args.data_root, limit=args.limit, model=args.model, cond=args.cond,
        preset=args.preset, holdout=args.holdout,
        steps=args.steps, minutes=args.minutes, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup,
        cooldown=args.cooldown,
        ema_decay=args.ema_decay, class_dropout=args.class_dropout, t_sampling=args.t_sampling,
        t_shift=args.t_shift, few_step=args.few_step, teacher=args.teacher, teacher_sampler=args.teacher_sampler,
        teacher_steps=args.teacher_steps, teacher_cfg=args.teacher_cfg,
        teacher_cfg_interval=tuple(args.teacher_cfg_interval), distill_paths=args.distill_paths, seed=args.seed,
        device=args.device, precision=args.precision,
        compile=args.compile, norm=args.norm, qk_norm=None if args.qk_norm is None else args.qk_norm == "on",
        mlp=args.mlp, pos=args.pos, pred=args.pred,
        log_every=args.log_every, val_every=args.val_every, sample_every=args.sample_every,
        ckpt_every=args.ckpt_every, sample_steps=args.sample_steps, sample_cfg=args.sample_cfg,
    )  # fmt: skip
    trainer = Trainer(cfg, overwrite=args.overwrite, require_resume=args.resume, progress=not args.no_progress)
    trainer.fit()
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    import time

    from tinydit.checkpoint import load_model, tokenizer_of
    from tinydit.distill import warn_if_untrained_settings
    from tinydit.export import check_output, write_samples
    from tinydit.runtime import autocast, maybe_compile, resolve_compile, resolve_precision
    from tinydit.sampling import check_sampler_args, generate, resolve_labels, resolve_prompts
    from tinydit.train import resolve_device

    options = _sampler_options(args)
    check_sampler_args(args.steps, args.cfg, args.sampler, **options)
    out = check_output(args.out)
    device = resolve_device(args.device)
    precision = resolve_precision(args.precision, device)
    model, state = load_model(args.checkpoint, ema=not args.no_ema, map_location=device)
    warn_if_untrained_settings(state, args.sampler, args.steps, args.cfg, args.grid)
    forward = maybe_compile(model, resolve_compile(args.compile, device))
    classes, tokenizer = state["data"]["classes"], tokenizer_of(state)
    if tokenizer is None:  # a class model
        if args.prompts:
            raise TinyDiTError(f"{args.checkpoint} is class-conditional (classes: {', '.join(classes)}): use "
                               "--class, not --prompt; prompts need a text run (--model mmdit or --cond text)")
        n = 64 if args.n is None else args.n
        y = labels = resolve_labels(args.classes, classes, n)
        names, nrow = classes, args.nrow or (len(classes) if not args.classes else min(8, n))
    else:
        if args.classes:
            raise TinyDiTError(f"{args.checkpoint} is a text-to-image model: use --prompt TEXT, not --class")
        prompts = args.prompts or state["data"]["prompts"]
        n = 8 if args.n is None else args.n
        y, labels = resolve_prompts(prompts, tokenizer, n)  # (P n, L), (P n,): one row per prompt
        names, nrow = prompts, args.nrow or n
    started = time.perf_counter()
    with autocast(device, precision):
        res = generate(forward, y, steps=args.steps, cfg_scale=args.cfg, seed=args.seed, sampler=args.sampler,
                       **options)  # fmt: skip
    write_samples(res.x.float(), labels, out, names, nrow=nrow)
    print(f"wrote {len(y)} samples to {out} ({args.sampler}, {res.nfe:g} model evaluations per image, "
          f"{time.perf_counter() - started:.1f} s)", file=sys.stderr)
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from tinydit.model import DEFAULT_PRESET, PRESETS, DiT, DiTConfig, count_params, get_preset
    from tinydit.registry import MODEL_TYPES, build_model, preset_config

    base = DiTConfig()
    shown = ("norm", "qk_norm", "mlp", "pos", "pred")  # the switches that differ from the original DiT block
    shapes_text = dict(cond="text", vocab_size=18, text_len=8, n_classes=4)  # the shapes captions' tokenizer
    print(f"{'preset':10} {'params':>8} {'+text':>8} {'dim':>5} {'depth':>5} {'heads':>5} {'patch':>5} "
          f"{'tokens@32':>9}  switches")  # fmt: skip
    for name in PRESETS:
        cfg = get_preset(name)
        switches = [f"{k}={getattr(cfg, k)}" for k in shown if getattr(cfg, k) != getattr(base, k)]
        mark = "  (default)" if name == DEFAULT_PRESET else ""
        text = count_params(DiT(get_preset(name, **shapes_text)))
        print(f"{name:10} {count_params(DiT(cfg)) / 1e6:7.2f}M {text / 1e6:7.2f}M {cfg.dim:5} {cfg.depth:5} "
              f"{cfg.n_heads:5} {cfg.patch_size:5} {cfg.n_tokens:9}  {' '.join(switches) or '-'}{mark}")
    mm = MODEL_TYPES["mmdit"]
    for name in mm.presets:
        cfg = preset_config("mmdit", name, **{k: v for k, v in shapes_text.items() if k != "cond"})
        switches = [f"{k}={getattr(cfg, k)}" for k in shown if getattr(cfg, k) != getattr(base, k)]
        mark = "  (default for --model mmdit)" if name == mm.default_preset else ""
        print(f"{name:10} {'-':>8} {count_params(build_model('mmdit', cfg)) / 1e6:7.2f}M {cfg.dim:5} "
              f"{cfg.depth}+{cfg.single_blocks:<3} {cfg.n_heads:5} {cfg.patch_size:5} {cfg.n_tokens:9}  "
              f"{' '.join(switches) or '-'}{mark}")
    print("params: class-conditional, 32x32 RGB, 10 classes; +text: with the text encoder, on the shapes captions. "
          "mmdit depth: joint + single-stream blocks.")
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line each, without source lines: they are meant for users."""
    print(f"tinydit: warning: {message}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    from tinydit import __version__

    parser = argparse.ArgumentParser(prog="tinydit", description="Flow-matching Diffusion Transformers on small images")
    parser.add_argument("--version", action="version", version=f"tinydit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train(sub)
    _add_sample(sub)
    _add_eval(sub)
    _add_sweep(sub)
    p = sub.add_parser("presets", help="list the model size presets")
    p.set_defaults(func=cmd_presets)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args = build_parser().parse_args(argv)
    args.argv = argv  # recorded in reports as the exact command
    try:
        with warnings.catch_warnings():  # restores the warning hooks afterwards
            warnings.simplefilter("default")
            warnings.showwarning = _show_warning
            return args.func(args)
    except TinyDiTError as err:
        print(f"tinydit {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as err:  # disk full, permissions: one line, not a traceback
        print(f"tinydit {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
