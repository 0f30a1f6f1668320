"""Training and sampling throughput of the DiT presets on this machine.

    python benchmarks/bench_train.py                       # every CPU-sized preset, both data shapes
    python benchmarks/bench_train.py --preset dit-1.9m --shape 1x28

Times full optimizer steps (forward, backward, clipping, AdamW, EMA) with the trainer's own code,
after warm-up, and reports the median over repeats, plus Euler sampling throughput. Prints a Markdown
table with the machine, torch version and date, ready for benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import statistics
import time

import torch

from tinydit.flow import flow_loss
from tinydit.model import PRESETS, DiT, count_params, get_preset
from tinydit.sampling import euler_sample
from tinydit.train import ema_update, resolve_device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench_train(model: DiT, batch: int, device: torch.device, steps: int, repeats: int) -> float:
    """Median images/s over ``repeats`` timings of ``steps`` optimizer steps each."""
    cfg = model.config
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, cfg.in_channels, cfg.img_size, cfg.img_size, device=device)
    noise, t = torch.randn_like(x), torch.rand(batch, device=device)
    y = torch.randint(0, cfg.n_classes + 1, (batch,), device=device)

    def step() -> None:
        loss = flow_loss(model, x, y, t, noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema_update(ema, model, 0.999)

    for _ in range(3):  # warm-up: allocator, kernels, optimizer state
        step()
    rates = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync(device)
        rates.append(steps * batch / (time.perf_counter() - start))
    return statistics.median(rates)


@torch.no_grad()
def bench_sample(model: DiT, n: int, device: torch.device, steps: int, cfg_scale: float) -> float:
    """Images/s of Euler sampling with guidance, median of 3."""
    c = model.config
    noise = torch.randn(n, c.in_channels, c.img_size, c.img_size, device=device)
    y = torch.arange(n, device=device) % c.n_classes
    model.eval()
    euler_sample(model, noise, y, 2, cfg_scale)  # warm-up
    rates = []
    for _ in range(3):
        sync(device)
        start = time.perf_counter()
        euler_sample(model, noise, y, steps, cfg_scale)
        sync(device)
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", help="preset(s) to measure (default: all but dit-32m on CPU)")
    parser.add_argument("--shape", action="append", help="CxS image shapes, e.g. 3x32 (shapes, CIFAR) or 1x28")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps per timing")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sample-steps", type=int, default=32)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    device = resolve_device(args.device)
    presets = args.preset or [p for p in PRESETS if device.type != "cpu" or p != "dit-32m"]
    shapes = args.shape or ["3x32", "1x28"]

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, device {device}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; {datetime.date.today()}")
    print(f"command: python benchmarks/bench_train.py {' '.join(os.sys.argv[1:])}".rstrip())
    print()
    print(f"| preset | params | image | tokens | train img/s (batch {args.batch}) | "
          f"sample img/s ({args.sample_steps} Euler steps, guidance on) |")
    print("|---|---|---|---|---|---|")
    for name in presets:
        for shape in shapes:
            c, s = (int(v) for v in shape.split("x"))
            torch.manual_seed(0)
            model = DiT(get_preset(name, img_size=s, in_channels=c)).to(device)
            train_rate = bench_train(model, args.batch, device, args.steps, args.repeats)
            sample_rate = bench_sample(model, args.batch, device, args.sample_steps, 2.0)
            print(f"| {name} | {count_params(model) / 1e6:.2f}M | {c}x{s}x{s} | {model.config.n_tokens} | "
                  f"{train_rate:.0f} | {sample_rate:.0f} |", flush=True)


if __name__ == "__main__":
    main()
