"""Where a training step of the quick start goes: the real ``Trainer.train_step`` of ``tinydit train --data
shapes`` (its default preset, batch, precision and alignment), split into its parts, eager and compiled.

    python benchmarks/bench_step_parts.py [--data shapes] [--steps 30] [--repeats 5]

Two splits of one step, each the median of ``--repeats`` timings of ``--steps`` steps:

- by part of the step, timed with the clock around each (CPU work runs in order, so the parts add up to the
  step): the batch and its random draws, the forward pass and flow-matching loss, the alignment's encoder
  target (REPA; kept per image after the first epoch, ``tinydit.train.repa.TargetCache``) and projector, the
  backward pass, gradient clipping, AdamW and the EMA;
- by kind of kernel, from the profiler's self times: the matmul kernels (matmuls, convolutions, attention's
  batched matmuls), code compiled by Inductor, and everything else (eager elementwise ops, norms, casts,
  the optimizer, Python).

Rows: eager and compiled (``--compile on``: the repeated blocks), each with the alignment's targets computed
every step (a run's first epoch) and kept (every later one). The FLOPs of a step are counted once by
``torch.utils.flop_counter`` (the matmuls and convolutions of forward and backward, the encoder's included);
the last lines give the achieved FLOP/s of the fastest row against this machine's probed matmul peak in the
run's precision (``bench_train.matmul_peak``), as ``mfu: 0.NN``.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import COMPILED_PREFIX, MATMUL_KERNELS, describe_peak, matmul_peak, mfu_text  # noqa: E402

from tinydit.compiling import unwrap  # noqa: E402
from tinydit.config import TrainConfig  # noqa: E402
from tinydit.flow.guidance import null_condition  # noqa: E402
from tinydit.flow.path import flow_loss, sample_t  # noqa: E402
from tinydit.runtime import autocast  # noqa: E402
from tinydit.train import Trainer, optim  # noqa: E402

PARTS = ("batch", "forward + loss", "encoder target", "projector", "backward", "clip", "AdamW", "EMA")


def fill_targets(tr: Trainer) -> None:
    """Keep every training image's alignment target, both ways round: the step as it runs after epoch one."""
    align, ds = tr.run.alignment, tr.data.train_set
    with torch.no_grad(), autocast(tr.device, tr.precision):
        for mirrored in (False, True):
            for idx in torch.arange(len(ds)).split(1024):
                flips = torch.full((len(idx),), mirrored)
                x, _ = ds.batch(idx, flips=flips)
                align._kept.get(x, idx, flips, align.target)


def timed_step(tr: Trainer, kept: bool) -> dict[str, float]:
    """One ``Trainer.train_step``, written out with a clock reading between its parts (the same calls)."""
    cfg, dev, run = tr.cfg, tr.device, tr.run
    clock = [time.perf_counter()]

    def tick() -> None:
        clock.append(time.perf_counter())

    g = optim.step_generator(cfg.seed, run.step)
    idx = tr.order.indices(run.step)
    flips = tr.data.train_set.draw_flips(len(idx), g)
    x, y = tr.data.batch(True, idx, device=dev, flips=flips)
    t = sample_t(len(x), generator=g, device=dev, kind=cfg.t_sampling, shift=cfg.t_shift)
    noise = torch.randn(x.shape, generator=g).to(dev)
    drop = torch.rand(len(x), generator=g) < cfg.class_dropout
    y = torch.where(drop, null_condition(unwrap(run.model), y), y)
    tick()
    with autocast(dev, tr.precision):
        flow = flow_loss(run.forward, x, y, t, noise)
        tick()
        align = run.alignment
        target = align._kept.get(x, idx, flips, align.target) if kept else align.target(x)
        tick()
        z = align.projector(align._tokens).float()
        align._tokens = None
        loss = flow - cfg.repa * torch.nn.functional.cosine_similarity(z, target, dim=-1).mean()
        tick()
    run.opt.zero_grad(set_to_none=True)
    loss.backward()
    tick()
    params = [p for group in run.opt.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    tick()
    run.opt.step()
    tick()
    optim.ema_update(run.ema, run.model, optim.ema_decay_at(cfg, run.step))
    run.step += 1
    tick()
    return {part: clock[i + 1] - clock[i] for i, part in enumerate(PARTS)}


def by_kernel(tr: Trainer, kept: bool, steps: int) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            timed_step(tr, kept)
    parts = {"matmul kernels": 0.0, "compiled (Inductor)": 0.0, "everything else": 0.0}
    for event in prof.key_averages():
        if event.key in MATMUL_KERNELS or event.key == "aten::convolution_backward":
            kind = "matmul kernels"
        elif event.key.startswith(COMPILED_PREFIX):
            kind = "compiled (Inductor)"
        else:
            kind = "everything else"
        parts[kind] += event.self_cpu_time_total / 1e6 / steps
    return parts


def step_flops(tr: Trainer, kept: bool) -> int:
    with FlopCounterMode(display=False) as counter:
        timed_step(tr, kept)
    return counter.get_total_flops()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="shapes")
    p.add_argument("--steps", type=int, default=30, help="steps per timing")
    p.add_argument("--repeats", type=int, default=5, help="timings per row; the median is reported")
    args = p.parse_args()
    rows = {}
    flops = peak = None
    for compiled in ("off", "on"):
        with tempfile.TemporaryDirectory() as out:
            tr = Trainer(TrainConfig(data=args.data, steps=10**6, compile=compiled, out=out), progress=False)
            if tr.run.alignment is None or tr.run.alignment._kept is None:
                raise SystemExit("this benchmark splits an aligned step; the run does not align or keep its targets")
            with tr.run.kernel():
                tr.run.model.train()
                for _ in range(5):  # warm-up: compiling, the kernels' probes
                    timed_step(tr, kept=False)
                if flops is None:
                    flops = {False: step_flops(tr, kept=False)}
                fill_targets(tr)
                if peak is None:
                    flops[True], peak = step_flops(tr, kept=True), matmul_peak(tr.device, tr.precision)
                for kept in (False, True):
                    runs = [[timed_step(tr, kept) for _ in range(args.steps)] for _ in range(args.repeats)]
                    per = {
                        part: statistics.median(sum(s[part] for s in run) / len(run) for run in runs) for part in PARTS
                    }
                    kinds = by_kernel(tr, kept, args.steps)
                    rows[(compiled, kept)] = (per, kinds, tr.batch_size, tr.precision, tr.cfg.preset)
    stamp = (
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"{datetime.date.today()}, {stamp}; data {args.data}")
    header = "| part (ms per step) | " + " | ".join(
        f"{'compiled' if c == 'on' else 'eager'}, targets {'kept' if k else 'computed'}" for c, k in rows
    )
    print(header + " |")
    print("|---" * (len(rows) + 1) + "|")
    for part in PARTS:
        print(f"| {part} | " + " | ".join(f"{r[0][part] * 1e3:.1f}" for r in rows.values()) + " |")
    totals = {key: sum(r[0].values()) for key, r in rows.items()}
    print("| **step** | " + " | ".join(f"**{v * 1e3:.1f}**" for v in totals.values()) + " |")
    print("| images/s | " + " | ".join(f"{r[2] / totals[k]:.0f}" for k, r in rows.items()) + " |")
    for kind in ("matmul kernels", "compiled (Inductor)", "everything else"):
        print(f"| {kind} (profiler) | " + " | ".join(f"{r[1][kind] * 1e3:.1f}" for r in rows.values()) + " |")
    best = min(totals, key=totals.get)
    _, kinds, batch, precision, preset = rows[best]
    work = flops[best[1]]
    print(
        f"preset {preset}, batch {batch}, {precision}; GFLOP per step: {flops[False] / 1e9:.2f} computing the "
        f"targets, {flops[True] / 1e9:.2f} keeping them"
    )
    print(f"matmul peak ({precision}): {describe_peak(peak)}")
    print(
        f"fastest row: {work / totals[best] / 1e9:.0f} GFLOP/s achieved; its matmul kernels alone run at "
        f"{work / kinds['matmul kernels'] / 1e9:.0f} GFLOP/s"
    )
    print(f"mfu: {mfu_text(work / totals[best] / max(peak.values()))}")


if __name__ == "__main__":
    main()
