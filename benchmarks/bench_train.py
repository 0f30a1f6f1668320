"""Training and sampling throughput, memory and model FLOP utilisation (MFU) on this machine.

    python benchmarks/bench_train.py                                  # every preset: the table in benchmarks/README.md
    python benchmarks/bench_train.py --preset dit-1.9m --switches     # each architecture switch alone
    python benchmarks/bench_train.py --preset dit-1.9m --modes        # fp32/bf16 x eager/compiled
    python benchmarks/bench_train.py --preset dit-1.9m --compare diffusers
    python benchmarks/bench_train.py --preset dit-0.2m --shape 1x28 --few-step   # shortcut training's cost
    python benchmarks/bench_train.py --preset dit-1.9m --breakdown    # where a step's time goes

A training step is the trainer's whole step: forward, MSE loss, backward, gradient clipping, AdamW
and the EMA update, on a batch already in memory. Every timing is the median of ``--repeats`` runs of
``--steps`` steps after warm-up. Rows measured against each other are interleaved (A, B, A, B, ...)
so that drifts in machine load hit both alike.

MFU = achieved FLOP/s / peak FLOP/s, both measured in this run. Achieved FLOPs per training step:

    3 x (2 x P x B x T + 4 x depth x B x T^2 x dim)

(P: weights of the linear maps applied to every token, B batch, T tokens; backward = 2x forward.)
The peak is the best fp32 (or --precision) matmul rate over square sizes 512-2048, through either of
PyTorch's CPU matmul libraries (BLAS via torch.mm, oneDNN via a 1x1 convolution), measured before
and after the model timings. With ``--compare diffusers`` the same loop times diffusers'
``DiTTransformer2DModel`` at equal width, depth, heads, patch and image size (``pip install
diffusers``), and the last two lines printed are ``mfu: 0.NN`` (TinyDiT; three decimals below 0.1) and
``speedup_vs_diffusers: N.NN`` (TinyDiT images/s over diffusers' images/s).

``--breakdown`` profiles the step (``torch.profiler``) and splits its time between the matmul kernels
(convolutions, BLAS and attention), code compiled by Inductor, and everything else. Its last line,
``mfu_ceiling: 0.NN``, is the MFU the step would reach if nothing but its matmul kernels took any
time: the bound that faster glue code cannot lift, only faster kernels or larger matrices.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch

from tinydit.config import TrainConfig
from tinydit.flow import flow_loss
from tinydit.flow.distill import KNOTS, distill_loss
from tinydit.flow.meanflow import FoldedGuidance, draw_interval, meanflow_loss
from tinydit.flow.samplers import sample, sample_path
from tinydit.flow.settings import SamplingSettings
from tinydit.flow.shortcut import shortcut_loss
from tinydit.models.attention import BACKENDS, attention_backend, resolve_backend
from tinydit.models.dit import PRESETS, SWITCHES, DiT, DiTConfig, count_params, get_preset
from tinydit.models.linear import BACKENDS as LINEAR_BACKENDS
from tinydit.models.linear import linear_backend, onednn_linear
from tinydit.models.linear import resolve_backend as resolve_linear
from tinydit.runtime import autocast, cpu_has_native_bf16, maybe_compile, resolve_device
from tinydit.train.optim import adamw, ema_update

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device: torch.device, precision: str) -> dict[str, float]:
    """Best FLOP/s of one square matmul over a few sizes, per library: the machine's practical peak.

    On a CPU PyTorch has two: ``torch.mm`` goes to its BLAS (MKL in the x86 wheels), and a 1x1
    convolution to oneDNN (``tinydit.models.linear.onednn_linear``). On our AMD EPYC, MKL ran at half of
    oneDNN's rate in fp32, so the peak that MFU divides by is the better of the two.
    """
    dtype = DTYPES[precision]
    kernels = {"blas": torch.mm}
    if device.type == "cpu" and torch.backends.mkldnn.is_available():
        kernels["onednn"] = onednn_linear  # a @ b^T: the same FLOPs as a @ b
    best = dict.fromkeys(kernels, 0.0)
    for n in (512, 1024, 2048):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        reps = max(2, int(4e9 / (2 * n**3))) if device.type == "cpu" else 50
        if precision != "fp32" and device.type == "cpu" and not cpu_has_native_bf16():
            reps = 1  # emulated bf16/fp16 matmuls: one is slow enough
        for name, matmul in kernels.items():
            matmul(a, b)  # warm-up
            for _ in range(3):
                sync(device)
                start = time.perf_counter()
                for _ in range(reps):
                    matmul(a, b)
                sync(device)
                best[name] = max(best[name], reps * 2 * n**3 / (time.perf_counter() - start))
    return best


def mfu_text(mfu: float) -> str:
    """Two decimals, or three below 0.1: a small model on a GPU uses well under 1% of it, not 0."""
    return f"{mfu:.2f}" if mfu >= 0.1 else f"{mfu:.3f}"


def best_peak(*peaks: dict[str, float]) -> float:
    return max(v for p in peaks for v in p.values())


def describe_peak(*peaks: dict[str, float]) -> str:
    """'438.1 GFLOP/s (best of blas 210.3, onednn 438.1)' from matmul_peak() results."""
    per = {k: max(p[k] for p in peaks) for k in peaks[0]}
    parts = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in per.items())
    return f"{best_peak(*peaks) / 1e9:.1f} GFLOP/s (best of {parts})"


class Workload:
    """One model's training step and sampler on a fixed in-memory batch."""

    def __init__(
        self,
        name: str,
        model: torch.nn.Module,
        forward: Callable,
        cfg: DiTConfig,
        batch: int,
        device: torch.device,
        precision: str,
    ):
        self.name, self.model, self.cfg, self.batch = name, model, cfg, batch
        # The objective: flow matching, or shortcut models' for a model that takes step sizes. The
        # distillation student (also a step-size model) is set to "distill" by its caller.
        self.objective = "shortcut" if getattr(cfg, "shortcut", False) else "flow"
        self.forward, self.device, self.precision = forward, device, precision
        self.attention = "auto"  # TinyDiT's attention kernel (tinydit.models.attention); diffusers' models ignore it
        self.linear = "auto"  # TinyDiT's token linears (tinydit.models.linear); diffusers' nn.Linear ignores it
        self.ema = copy.deepcopy(model).requires_grad_(False)
        self.compiled = False  # whether ``forward`` is compiled (tinydit_workload sets it)
        self.opt = adamw(model.parameters(), device, lr=1e-4)  # the trainer's optimizer, for every model raced
        g = torch.Generator().manual_seed(0)
        shape = (batch, cfg.in_channels, cfg.img_size, cfg.img_size)
        self.x = torch.randn(shape, generator=g).to(device)
        self.noise = torch.randn(shape, generator=g).to(device)
        self.t = torch.rand(batch, generator=g).to(device)
        self.y = torch.randint(0, cfg.n_classes + 1, (batch,), generator=g).to(device)

    @contextlib.contextmanager
    def kernels(self) -> Iterator[None]:
        """This workload's linear and attention kernels and its precision, as the trainer runs them."""
        with linear_backend(self.linear), attention_backend(self.attention), autocast(self.device, self.precision):
            yield

    def step(self) -> None:
        with self.kernels():
            if self.objective == "shortcut":
                loss = shortcut_loss(self.forward, self.x, self.y, self.t, self.noise, torch.Generator().manual_seed(0))
            elif self.objective == "meanflow":  # the trainer's defaults: a quarter of intervals, guidance folded
                if not hasattr(self, "r"):
                    g = torch.Generator().manual_seed(1)
                    self.r, self.t = draw_interval(self.t, torch.rand(self.batch, generator=g).to(self.device), g)
                model = self.model
                null = model.null_condition(self.y)
                guidance = FoldedGuidance(2.0, self.y != null, null)
                weighted, _ = meanflow_loss(self.forward, model, self.x, self.y, self.r, self.t, self.noise, guidance)
                loss = weighted.mean()
            elif self.objective == "distill":
                if not hasattr(self, "paths"):  # teacher paths at the 9 knots, stored in fp16 as the trainer does
                    paths = torch.randn(self.batch, KNOTS + 1, *self.x.shape[1:], generator=torch.Generator())
                    self.paths = paths.to(torch.float16).to(self.device)
                loss = distill_loss(self.forward, self.paths, self.y, torch.Generator().manual_seed(0))
            else:
                loss = flow_loss(self.forward, self.x, self.y, self.t, self.noise)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        ema_update(self.ema, self.model, 0.999)

    def time_steps(self, steps: int) -> float:
        sync(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        sync(self.device)
        return (time.perf_counter() - start) / steps


# Profiler keys (self time) of the kernels that do the counted FLOPs, by kind; "## Call CompiledFxGraph"
# is Inductor's generated code. The _slow_conv2d kernels run convolutions too small for oneDNN, or any
# with one thread.
MATMUL_KERNELS = (
    "aten::mkldnn_convolution",
    "aten::convolution_backward",
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::_mkldnn_linear",
    "aten::mkldnn_linear_backward",
    "aten::_slow_conv2d_forward",
    "aten::_slow_conv2d_backward",
)
ATTENTION_PREFIX = "aten::_scaled_dot_product"  # SDPA's forward and backward kernels
COMPILED_PREFIX = "## Call CompiledFxGraph"
# The kinds of work breakdown() reports, as printed.
MATMULS, SDPA, COMPILED = "matmuls and convolutions (BLAS, oneDNN)", "SDPA kernels", "compiled code (Inductor)"
REST = "everything else (elementwise, norms, copies, optimizer, Python)"


def breakdown(w: Workload, steps: int) -> dict[str, float]:
    """Seconds per training step by kind of work, from the profiler's self times over ``steps`` steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            w.step()
    parts = dict.fromkeys((MATMULS, SDPA, COMPILED, REST), 0.0)
    for event in prof.key_averages():
        if event.key in MATMUL_KERNELS:
            kind = MATMULS
        elif event.key.startswith(ATTENTION_PREFIX):
            kind = SDPA
        elif event.key.startswith(COMPILED_PREFIX):
            kind = COMPILED
        else:
            kind = REST
        parts[kind] += event.self_cpu_time_total / 1e6 / steps
    return parts


def teacher_path_rate(w: Workload, n: int = 500) -> tuple[float, int]:
    """Teacher paths per second, and model evaluations per path: ``n`` paths in one batch, sampled with
    the ``--objective distill`` defaults as ``tinydit.flow.distill.teacher_paths`` samples them."""
    d = TrainConfig  # the --objective distill defaults
    noise = torch.randn(n, w.cfg.in_channels, w.cfg.img_size, w.cfg.img_size, device=w.device)
    y = torch.arange(n, device=w.device) % w.cfg.n_classes
    teacher = SamplingSettings(d.teacher_sampler, d.teacher_steps, d.teacher_cfg, cfg_interval=d.teacher_cfg_interval)
    w.model.eval()
    times = []
    for _ in range(3):
        sync(w.device)
        start = time.perf_counter()
        with torch.no_grad(), w.kernels():
            _, nfe = sample_path(teacher, w.model, noise, y, KNOTS)
        sync(w.device)
        times.append(time.perf_counter() - start)
    w.model.train()
    return n / sorted(times)[1], nfe


def tinydit_workload(
    cfg: DiTConfig,
    batch: int,
    device: torch.device,
    precision: str,
    compiled: bool,
    attention: str = "auto",
    linear: str = "auto",
) -> Workload:
    torch.manual_seed(0)
    model = DiT(cfg).to(device)
    w = Workload("TinyDiT", model, model, cfg, batch, device, precision)  # its EMA copied from the plain model
    # compiled after the copy: on a CPU the blocks compile in place, and a copy would share their compiled code
    w.forward, w.compiled = maybe_compile(model, compiled), compiled
    w.attention, w.linear = attention, linear
    return w


def diffusers_workload(
    cfg: DiTConfig, batch: int, device: torch.device, precision: str, matmul_attention: bool = False
) -> Workload:
    """diffusers' DiT at the same width, depth, heads, patch and image size (adaLN-Zero, GELU-tanh).

    Its default attention is SDPA (``AttnProcessor2_0``); ``matmul_attention`` switches it to its
    ``AttnProcessor``, which writes attention out as batched matmuls and a softmax like TinyDiT's CPU
    half-precision kernel.
    """
    try:
        from diffusers import DiTTransformer2DModel
        from diffusers.models.attention_processor import Attention, AttnProcessor
    except ImportError:
        sys.exit("--compare diffusers needs diffusers: pip install diffusers")
    torch.manual_seed(0)
    model = DiTTransformer2DModel(
        num_attention_heads=cfg.n_heads,
        attention_head_dim=cfg.head_dim,
        in_channels=cfg.in_channels,
        out_channels=cfg.in_channels,
        num_layers=cfg.depth,
        sample_size=cfg.img_size,
        patch_size=cfg.patch_size,
        num_embeds_ada_norm=cfg.n_classes + 1,
        norm_type="ada_norm_zero",
    ).to(device)
    if matmul_attention:
        for module in model.modules():
            if isinstance(module, Attention):
                module.set_processor(AttnProcessor())

    def forward(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return model(x, timestep=1000 * t, class_labels=y).sample  # diffusers counts time in 0-1000

    name = "diffusers, AttnProcessor (matmul attention)" if matmul_attention else "diffusers (SDPA, its default)"
    return Workload(name, model, forward, cfg, batch, device, precision)


def race(workloads: list[Workload], steps: int, repeats: int) -> list[float]:
    """Median seconds per training step of each workload, timed in turns after a warm-up."""
    for w in workloads:
        for _ in range(3):  # allocator, kernels, optimizer state; compilation for compiled ones
            w.step()
    times: list[list[float]] = [[] for _ in workloads]
    for _ in range(repeats):
        for i, w in enumerate(workloads):
            times[i].append(w.time_steps(steps))
    return [statistics.median(t) for t in times]


@torch.no_grad()
def sample_rate(w: Workload, n: int, steps: int) -> float:
    """Images/s of Euler sampling with guidance (2 evaluations per step), median of 3."""
    cfg = w.cfg
    noise = torch.randn(n, cfg.in_channels, cfg.img_size, cfg.img_size, device=w.device)
    y = torch.arange(n, device=w.device) % cfg.n_classes
    forward = maybe_compile(w.ema, w.compiled)
    with w.kernels():
        sample(SamplingSettings("euler", 2, 2.0), forward, noise, y)  # warm-up
        rates = []
        for _ in range(3):
            sync(w.device)
            start = time.perf_counter()
            sample(SamplingSettings("euler", steps, 2.0), forward, noise, y)
            sync(w.device)
            rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


def _high_water_kib() -> int:
    """Peak resident memory of this process in KiB. Linux's VmHWM starts afresh at exec, unlike
    ru_maxrss, which a spawned child inherits from its (large) parent."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _peak_memory_child(cfg: dict, batch: int, device: str, precision: str, queue: mp.Queue) -> None:
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    base = _high_water_kib()
    w = tinydit_workload(DiTConfig(**cfg), batch, dev, precision, compiled=False)
    for _ in range(2):
        w.step()
    if dev.type == "cuda":
        queue.put(torch.cuda.max_memory_allocated(dev) / 2**20)
    else:  # the high-water mark above the freshly imported process
        queue.put((_high_water_kib() - base) / 1024)


def peak_memory_mb(cfg: DiTConfig, batch: int, device: torch.device, precision: str) -> float:
    """Peak memory of two training steps, measured in a fresh process so earlier rows don't count."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_peak_memory_child, args=(cfg.to_dict(), batch, str(device), precision, queue))
    proc.start()
    value = queue.get()
    proc.join()
    return value


def picked_linear(args: argparse.Namespace, device: torch.device) -> str:
    """The kernel of TinyDiT's token linears: the forced one, or what ``auto`` picks here (tinydit.models.linear)."""
    if args.linear != "auto":
        return args.linear
    with autocast(device, args.precision):
        return f"auto = {resolve_linear(torch.empty(0, device=device))}"


def picked_attention(args: argparse.Namespace, device: torch.device) -> str:
    """The attention kernel TinyDiT runs with: the forced one, or what ``auto`` picks for this device and precision."""
    if args.attention != "auto":
        return args.attention
    return f"auto = {resolve_backend(torch.empty(0, device=device, dtype=DTYPES[args.precision]))}"


def header(args: argparse.Namespace, device: torch.device) -> None:
    cpu = (
        f"{platform.processor() or platform.machine()} ({torch.backends.cpu.get_cpu_capability()}, "
        f"native bf16: {'yes' if cpu_has_native_bf16() else 'no'})"
    )
    if device.type == "cuda":
        cpu = torch.cuda.get_device_name(device)
    print(
        f"machine: {cpu}, {os.cpu_count()} CPUs, device {device}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; {datetime.date.today()}"
    )
    script = f"benchmarks/{os.path.basename(sys.argv[0])}"  # the script that is running (ablation, ...)
    print(f"command: python {script} {' '.join(sys.argv[1:])}".rstrip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", help="preset(s) to measure (default: all that fit the device)")
    parser.add_argument("--shape", default="3x32", help="CxS image shape: 3x32 (shapes, CIFAR-10) or 1x28 (FMNIST)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="training steps per timing")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sample-steps", type=int, default=16)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="fp32", choices=list(DTYPES))
    parser.add_argument("--compile", action="store_true", help="torch.compile TinyDiT's forward")
    parser.add_argument(
        "--linear",
        default="auto",
        choices=LINEAR_BACKENDS,
        help="TinyDiT's token-linear kernel (tinydit.models.linear; auto: as the trainer picks)",
    )
    parser.add_argument(
        "--attention",
        default="auto",
        choices=BACKENDS,
        help="TinyDiT's attention kernel (tinydit.models.attention; auto: as the trainer picks)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--switches", action="store_true", help="one row per architecture switch")
    mode.add_argument("--modes", action="store_true", help="fp32/bf16 x eager/compiled for one preset")
    mode.add_argument("--compare", choices=["diffusers"], help="race diffusers' DiT at the same configuration")
    mode.add_argument(
        "--few-step", action="store_true", help="a flow-matching step against shortcut, mean-flow and student steps"
    )
    mode.add_argument("--breakdown", action="store_true", help="where one preset's step time goes, and its MFU ceiling")
    args = parser.parse_args()
    device = resolve_device(args.device)
    channels, size = (int(v) for v in args.shape.split("x"))
    presets = args.preset or [p for p in PRESETS if device.type != "cpu" or p != "dit-32m"]
    header(args, device)
    peak_before = matmul_peak(device, args.precision)

    def peaks_after() -> tuple[tuple[dict[str, float], ...], float]:  # measured again after the model timings
        peaks = (peak_before, matmul_peak(device, args.precision))
        return peaks, best_peak(*peaks)

    def ours(cfg: DiTConfig) -> Workload:  # TinyDiT as the command line asks
        return tinydit_workload(cfg, args.batch, device, args.precision, args.compile, args.attention, args.linear)

    if args.compare:
        cfg = get_preset(presets[0], img_size=size, in_channels=channels)
        mine = ours(cfg)
        theirs = diffusers_workload(cfg, args.batch, device, args.precision)
        theirs_matmul = diffusers_workload(cfg, args.batch, device, args.precision, matmul_attention=True)
        t_ours, t_theirs, t_theirs_matmul = race([mine, theirs, theirs_matmul], args.steps, args.repeats)
        peaks, peak = peaks_after()
        flops = 3 * DiT(cfg).flops_per_image() * args.batch
        print(
            f"config: {presets[0]} ({args.shape}, {cfg.n_tokens} tokens, dim {cfg.dim}, depth {cfg.depth}, "
            f"{cfg.n_heads} heads, patch {cfg.patch_size}), batch {args.batch}, {args.precision}"
            f"{', compiled' if args.compile else ''}; TinyDiT attention: {picked_attention(args, device)}, "
            f"linears: {picked_linear(args, device)}; matmul peak {describe_peak(*peaks)}"
        )
        print(
            "FLOPs per step = 3 x (2 P B T + 4 depth B T^2 dim) "
            f"= {flops / 1e9:.2f} GFLOP (P = {DiT(cfg).token_params():,} per-token weights)"
        )
        print()
        print("| model | params | train img/s | step ms | achieved GFLOP/s | MFU | TinyDiT's speedup |")
        print("|---|---|---|---|---|---|---|")
        for w, t in ((mine, t_ours), (theirs, t_theirs), (theirs_matmul, t_theirs_matmul)):
            print(
                f"| {w.name} | {count_params(w.model) / 1e6:.2f}M | {args.batch / t:.0f} | {1000 * t:.0f} | "
                f"{flops / t / 1e9:.1f} | {mfu_text(flops / t / peak)} | {t / t_ours:.2f}x |"
            )
        print()
        print(f"mfu: {mfu_text(flops / t_ours / peak)}")
        print(f"speedup_vs_diffusers: {t_theirs / t_ours:.2f}")
        return

    if args.modes:
        cfg = get_preset(presets[0], img_size=size, in_channels=channels)
        modes = [(p, c) for p in ("fp32", "bf16") for c in (False, True)]
        if device.type == "cuda":
            modes += [("fp16", False), ("fp16", True)]
        rows = [(p, c, tinydit_workload(cfg, args.batch, device, p, c, args.attention, args.linear)) for p, c in modes]
        print(f"config: {presets[0]} ({args.shape}), batch {args.batch}; fp32 matmul peak {describe_peak(peak_before)}")
        print()
        print("| precision | compiled | train img/s | vs fp32 eager | sample img/s |")
        print("|---|---|---|---|---|")
        slow = device.type == "cpu" and not cpu_has_native_bf16()  # emulated bf16: time single steps
        times = race([w for _, _, w in rows], 1 if slow else args.steps, args.repeats)
        for (p, c, w), t in zip(rows, times, strict=True):
            print(
                f"| {p} | {'yes' if c else 'no'} | {args.batch / t:.0f} | {times[0] / t:.2f}x | "
                f"{sample_rate(w, args.batch, args.sample_steps):.0f} |",
                flush=True,
            )
        return

    if args.few_step:
        cfg = get_preset(presets[0], img_size=size, in_channels=channels)
        plain, shortcut, student = ours(cfg), ours(replace(cfg, shortcut=True)), ours(replace(cfg, shortcut=True))
        student.objective = "distill"
        mean_flow = ours(replace(cfg, shortcut=True))
        mean_flow.objective = "meanflow"
        t_plain, t_short, t_student, t_mean = race([plain, shortcut, student, mean_flow], args.steps, args.repeats)
        print(f"config: {presets[0]} ({args.shape}), batch {args.batch}, {args.precision}")
        print()
        print("| objective | train img/s | step ms | cost vs flow matching |")
        print("|---|---|---|---|")
        print(f"| flow matching | {args.batch / t_plain:.0f} | {1000 * t_plain:.0f} | 1.00x |")
        rows = (
            ("shortcut (1/4 self-consistency)", t_short),
            ("mean flow (1/4 intervals, guidance 2 folded)", t_mean),
            ("distillation student", t_student),
        )
        for name, t in rows:
            print(f"| {name} | {args.batch / t:.0f} | {1000 * t:.0f} | {t / t_plain:.2f}x |")
        print()
        rate, nfe = teacher_path_rate(plain)
        d = TrainConfig
        print(
            f"teacher paths for distillation: {rate:.0f} paths/s ({d.teacher_sampler}, {d.teacher_steps} steps, "
            f"guidance {d.teacher_cfg:g} for t in [{d.teacher_cfg_interval[0]:g}, {d.teacher_cfg_interval[1]:g}]: "
            f"{nfe} evaluations each, the --objective distill default)"
        )
        return

    if args.breakdown:
        if device.type != "cpu":  # a GPU's kernels run asynchronously: their CPU time is launch overhead
            sys.exit("--breakdown profiles CPU time, which on a GPU measures kernel launches: run it on a CPU")
        cfg = get_preset(presets[0], img_size=size, in_channels=channels)
        w = ours(cfg)
        (t_step,) = race([w], args.steps, args.repeats)
        parts = breakdown(w, args.steps * args.repeats)
        peaks, peak = peaks_after()
        flops = 3 * w.model.flops_per_image() * args.batch
        kernels = parts[MATMULS] + parts[SDPA]
        if not kernels:
            sys.exit(f"no matmul kernel among the profiler's keys: update MATMUL_KERNELS for torch {torch.__version__}")
        total = sum(parts.values())
        print(
            f"config: {presets[0]} ({args.shape}), batch {args.batch}, {args.precision}"
            f"{', compiled' if args.compile else ''}; attention: {picked_attention(args, device)}, "
            f"linears: {picked_linear(args, device)}; matmul peak {describe_peak(*peaks)}"
        )
        print(
            f"step: {1000 * t_step:.0f} ms unprofiled, MFU {mfu_text(flops / t_step / peak)}; "
            f"{1000 * total:.0f} ms under the profiler, split below (self times)"
        )
        print()
        print("| part of the step | ms per step | share |")
        print("|---|---|---|")
        for kind, t in parts.items():
            print(f"| {kind} | {1000 * t:.1f} | {t / total:.0%} |")
        print()
        print(
            f"the matmul and attention kernels alone: {1000 * kernels:.0f} ms for {flops / 1e9:.1f} GFLOP, "
            f"{flops / kernels / 1e9:.0f} GFLOP/s"
        )
        print(f"mfu_ceiling: {mfu_text(flops / kernels / peak)}")
        return

    if args.switches:
        base = get_preset(presets[0], img_size=size, in_channels=channels)
        rows = [(name, replace(base, **sw)) for name, sw in SWITCHES.items()]
        title = f"switch ({presets[0]}, {args.shape})"
    else:
        rows = [(name, get_preset(name, img_size=size, in_channels=channels)) for name in presets]
        title = f"preset ({args.shape})"
    workloads = [ours(cfg) for _, cfg in rows]
    times = race(workloads, args.steps, args.repeats)
    peaks, peak = peaks_after()
    print(
        f"batch {args.batch}, {args.precision}{', compiled' if args.compile else ''}; "
        f"matmul peak {describe_peak(*peaks)}; MFU counts 3 x (2 P B T + 4 depth B T^2 dim) FLOPs per step"
    )
    print()
    print(
        f"| {title} | params | tokens | train img/s | MFU | sample img/s ({args.sample_steps} Euler steps, "
        "guided) | peak train memory MiB |"
    )
    print("|---|---|---|---|---|---|---|")
    for (name, cfg), w, t in zip(rows, workloads, times, strict=True):
        flops = 3 * w.model.flops_per_image() * args.batch
        print(
            f"| {name} | {count_params(w.model) / 1e6:.2f}M | {cfg.n_tokens} | {args.batch / t:.0f} | "
            f"{mfu_text(flops / t / peak)} | {sample_rate(w, args.batch, args.sample_steps):.0f} | "
            f"{peak_memory_mb(cfg, args.batch, device, args.precision):.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
