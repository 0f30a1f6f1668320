"""How the model runs on a device: the device itself, numeric precision, ``torch.compile`` and the
kernel switches, chosen per device.

The defaults are what measured fastest (``python benchmarks/bench_train.py --modes`` compares them):

- CPU: bf16 autocast where a bf16 matmul is measured clearly faster than a fp32 one on this machine
  (``cpu_bf16_is_faster``: AMX, and some AVX512-BF16 parts), else fp32. Reporting native bf16 is not
  enough: an AVX512-BF16 CPU without AMX can run bf16 matmuls at half its fp32 rate, and CPUs without
  native bf16 emulate it at a crawl.
- ``torch.compile`` on CPU makes a training step faster, but compiling the repeated blocks takes tens of
  seconds at the start of a run on a small CPU from an empty cache (seconds from the kept one,
  ``tinydit.compiling``), and how much faster a step gets differs from CPU to CPU: ``auto`` compiles a CPU
  `minutes` run where a C++ compiler is found and this machine's earlier runs of the same kind measured
  more steps in the budget compiled than eager (``choose_compile``; the record is ``tinydit.machine``'s),
  and never a `steps` run or sampling.
- CUDA: bf16 autocast where supported, and ``torch.compile``.

Master weights, gradients, optimizer state and the EMA stay in fp32 in every mode: autocast lowers the
precision of the matmuls and convolutions inside the forward pass and, on a CPU, of the adaLN norms
and modulation (``tinydit.models.dit.norm_modulate``) and of attention's softmax (``tinydit.models.attention``);
the residual stream stays fp32.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch
from torch import nn

from tinydit import compiling, machine
from tinydit.errors import TinyDiTError

__all__ = [
    "PRECISIONS",
    "COMPILE",
    "COMPILE_CPU_MINUTES",
    "COMPILE_SCOPES",
    "compile_scope",
    "get_device",
    "resolve_device",
    "cpu_has_native_bf16",
    "cpu_bf16_is_faster",
    "resolve_precision",
    "has_cxx_compiler",
    "CompileChoice",
    "choose_compile",
    "record_run",
    "resolve_compile",
    "autocast",
    "make_grad_scaler",
    "maybe_compile",
    "KernelSwitch",
]

PRECISIONS = ("fp32", "bf16", "fp16")
COMPILE = ("auto", "on", "off")
# What a CPU compiles: each repeated block in place ("blocks", the default: one block's graph compiles, so a
# cold start is shorter) or the whole model ("model", CUDA's way; the glue between the blocks compiles too).
# TINYDIT_COMPILE_SCOPE chooses for a process (benchmarks/bench_compile_start.py races the two).
COMPILE_SCOPES = ("blocks", "model")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def get_device() -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """``auto`` becomes ``get_device()``; any other name is checked against what this machine has."""
    if isinstance(name, torch.device):
        return name
    if name == "auto":
        return get_device()
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise TinyDiTError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TinyDiTError(f"device {name!r} asked for, but CUDA is not available here; use `device` cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise TinyDiTError(f"device {name!r} asked for, but MPS is not available here; use `device` cpu")
    return device


class KernelSwitch:
    """A per-process choice between kernels that compute the same function (``tinydit.models.attention``,
    ``tinydit.models.linear``): ``auto`` lets the kernel's own rule decide, ``use(name)`` forces one
    inside a with-block, for benchmarks, tests and exact continuations, and the environment variable
    ``TINYDIT_<WHAT>_KERNEL`` (``TINYDIT_LINEAR_KERNEL=blas``) forces one for the whole process.

    ``warm_up`` (optional) is run eagerly by ``maybe_compile`` before compiling, so that compiled code
    only reads what it measured (a timing probe must never be traced).
    """

    def __init__(self, what: str, choices: tuple[str, ...], warm_up: Callable[[], object] | None = None):
        self.what, self.choices, self.warm_up = what, ("auto", *choices), warm_up
        # TINYDIT_<WHAT>_KERNEL pins the kernel for a whole process, over what auto would choose (a timing
        # probe's answer, kept per machine by tinydit.machine): so that runs on two machines, or where the
        # record cannot be kept, use one kernel and do not differ by rounding.
        self.env = f"TINYDIT_{what.upper()}_KERNEL"
        self.forced = os.environ.get(self.env, "auto")
        if self.forced not in self.choices:  # read at import, before any error could be one clear line
            warnings.warn(
                f"{self.env}={self.forced!r} is not one of {', '.join(self.choices)}; using auto", stacklevel=2
            )
            self.forced = "auto"
        _SWITCHES.append(self)

    @contextlib.contextmanager
    def use(self, name: str) -> Iterator[None]:
        """Use kernel ``name`` (one of ``choices``) inside the block."""
        if name not in self.choices:
            raise TinyDiTError(f"{self.what} backend must be one of {', '.join(self.choices)}, got {name!r}")
        previous, self.forced = self.forced, name
        try:
            yield
        finally:
            self.forced = previous


_SWITCHES: list[KernelSwitch] = []


def cpu_has_native_bf16() -> bool:
    """True where oneDNN runs bf16 matmuls in hardware (AVX512-BF16, AMX) rather than emulating them."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN, or an older torch
        return False


# bf16 must beat fp32 by this factor in the probe: a training step also pays for casts and for the
# element-wise work that bf16 does not speed up, so a matmul that is only a little faster loses overall.
BF16_MARGIN = 1.5


@functools.lru_cache(maxsize=1)
def cpu_bf16_is_faster() -> bool:
    """Whether a bf16 matmul of a DiT token layer's shape runs at least ``BF16_MARGIN`` times the fp32
    rate on this CPU: timed once per machine (about a tenth of a second) and kept in the machine record
    (``tinydit.machine``), so every run on the machine chooses alike."""
    return cpu_has_native_bf16() and machine.answer("cpu_bf16_is_faster", _time_bf16)


def _time_bf16() -> bool:
    """The probe itself: bf16 against fp32 on a (4096 x 128) @ (128 x 512) product, the best of three each."""
    g = torch.Generator().manual_seed(0)  # its own generator: a seeded run draws the same, probed or not
    rates = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(4096, 128, generator=g).to(dtype)
        b = torch.randn(128, 512, generator=g).to(dtype)
        best = float("inf")
        for _ in range(3):  # the best of three: a busy moment slows one, not all
            start = time.perf_counter()
            for _ in range(4):
                torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
        rates[dtype] = 1 / best
    return rates[torch.bfloat16] >= BF16_MARGIN * rates[torch.float32]


def cuda_bf16_is_native() -> bool:
    """Whether the GPU computes in bf16 itself (Ampere and newer). Older GPUs (a T4, a V100) only emulate it,
    far slower than fp32, though ``torch.cuda.is_bf16_supported()`` counts emulation as support."""
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # a torch that predates the argument counts native support only
        return torch.cuda.is_bf16_supported()


def resolve_precision(name: str, device: torch.device) -> str:
    """'auto' becomes the fastest precision measured on this kind of device; others are checked."""
    if name == "auto":
        if device.type == "cuda":
            return "bf16" if cuda_bf16_is_native() else "fp32"
        if device.type == "cpu" and cpu_bf16_is_faster():
            return "bf16"
        return "fp32"
    if name not in PRECISIONS:
        raise TinyDiTError(f"`precision` must be auto, {', '.join(PRECISIONS)}; got {name!r}")
    if name == "fp16" and device.type != "cuda":
        raise TinyDiTError(
            f"`precision` fp16 needs a CUDA device (it trains with a gradient scaler); on {device.type} "
            "use `precision` auto, fp32 or bf16"
        )
    return name


# With no compiled run of its kind recorded on the machine, a CPU training run with a time budget of at least
# this many minutes compiles under `auto`, from an empty cache, to measure it: a budget this long wins a cold
# start back on the CPUs measured so far, a shorter one may not. Once measured, the record decides.
COMPILE_CPU_MINUTES = 3.0
EAGER = "eager"  # the way an uncompiled run ran, in the machine record; a compiled one's is compiled_way(cache)


def has_cxx_compiler() -> bool:
    """Whether Inductor's CPU backend finds a C++ compiler (``$CXX``, else g++, c++ or clang++ on PATH)."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
    return any(shutil.which(n) for n in names)


def compiled_way(cache: str) -> str:
    """How a compiled run ran, in the machine record: from an "empty" or the "kept" cache."""
    return f"compiled, {cache} cache"


@dataclass(frozen=True)
class CompileChoice:
    """``compile`` resolved for a run: ``compiles``; ``why``, the reason `auto` gave for a CPU `minutes` run
    ("" where a flag or the device decided); ``cache``, what a compiled CPU run of a known kind starts from
    ("empty" or "kept"), under which its measurement is recorded."""

    compiles: bool
    why: str = ""
    cache: str | None = None

    @property
    def way(self) -> str:
        """How the run runs, as the machine record names it (``record_run``)."""
        return compiled_way(self.cache) if self.compiles else EAGER


def choose_compile(
    flag: str | bool,
    device: torch.device,
    minutes: float | None = None,
    kind: str | None = None,
    began: bool | None = None,
) -> CompileChoice:
    """Whether a run compiles, and why. 'on' and 'off' decide; 'auto' compiles on CUDA, never on MPS, a CPU
    `steps` run or sampling (``minutes`` None), and a CPU `minutes` run where a C++ compiler is found and
    the runs of ``kind`` recorded on this machine say it pays (``_weigh``). ``began``: whether the run this
    continues compiled (its checkpoint's), which `auto` keeps: the two round differently. Without ``kind``,
    a long enough budget compiles, as a first run of a kind does."""
    if isinstance(flag, bool) or flag in ("on", "off"):
        choice = CompileChoice(flag in (True, "on"))
    elif flag != "auto":
        raise TinyDiTError(f"`compile` must be auto, on or off; got {flag!r}")
    elif began is not None:
        what = "compiling the model's blocks" if began else "not compiling"
        why = f"{what}, as this run did when it began: the two round differently"
        quiet = minutes is None and not began  # an eager `steps` run is what it would be anyway: nothing to say
        choice = CompileChoice(began, "" if quiet else why)
    elif device.type != "cpu" or minutes is None:
        choice = CompileChoice(device.type == "cuda")
    elif not has_cxx_compiler():  # Inductor would fail at the first step
        choice = CompileChoice(False, "not compiling: no C++ compiler found ($CXX, g++, c++ or clang++)")
    else:
        choice = _weigh(minutes, machine.runs(kind) if kind is not None else {})
    if device.type != "cpu":
        return replace(choice, why="")
    if choice.compiles:
        compile_scope()  # a bad TINYDIT_COMPILE_SCOPE is refused with the choice, before a run writes anything
        if kind is not None and choice.cache is None:  # `on`, or a continuation: measured all the same
            choice = replace(choice, cache=_cache(machine.runs(kind)))
    return choice


def _weigh(minutes: float, runs: dict[str, dict[str, float]]) -> CompileChoice:
    """`auto` on a CPU with a compiler, for a `minutes` run whose kind's earlier runs on this machine measured
    ``runs`` (``machine.runs``): compile where the compiled runs' rate, over the budget less their start-up
    (from the empty or the kept cache, as this run will start), holds more steps than the eager runs'.

    What is not measured yet is measured first, so that every machine learns its own answer: a rule that
    compiled only where compiling was measured to pay would never compile to measure it, and a rule that
    never ran eagerly would never learn that eager wins. So a run whose compiled way is unrecorded compiles
    (the first compiles from an empty cache, as every CPU run of ``COMPILE_CPU_MINUTES`` or more did before
    the record: no worse than that; a shorter one runs eagerly, unless the cache is kept, which starts in
    seconds), even where an eager rate is known; then, with no eager run recorded, one runs eagerly. Each
    costs a kind at most one run's difference, once per machine."""
    cache = _cache(runs)
    compiled, eager = runs.get(compiled_way(cache)), runs.get(EAGER)
    start = "the kept cache" if cache == "kept" else "an empty cache"
    if compiled is None:
        if cache == "kept" or minutes >= COMPILE_CPU_MINUTES:
            why = f"compiling to measure: no compiled run of this model from {start} is recorded on this machine yet"
            return CompileChoice(True, why, cache)
        return CompileChoice(
            False,
            f"not compiling: a {minutes:g}-minute run is too short to compile from an empty cache before a compiled "
            "run of this model is recorded on this machine",
        )
    if eager is None:
        why = "not compiling, to measure: no eager run of this model is recorded on this machine yet, to weigh the "
        return CompileChoice(False, why + "compiled one against")
    seconds = 60 * minutes
    steps_compiled, steps_eager = _steps(compiled, seconds), _steps(eager, seconds)
    if steps_compiled > steps_eager:
        return CompileChoice(
            True,
            f"compiling the model's blocks: on this machine a compiled {minutes:g}-minute run of this model holds "
            f"about {steps_compiled:,} steps from {start}, an eager one {steps_eager:,}",
            cache,
        )
    return CompileChoice(
        False,
        f"not compiling: on this machine an eager {minutes:g}-minute run of this model holds about {steps_eager:,} "
        f"steps, a compiled one {steps_compiled:,} from {start}",
    )


def _cache(runs: dict[str, dict[str, float]]) -> str:
    """What a compiled run starts from: "kept" where a compiled run of its kind has finished on this machine and
    the compile cache still holds files (Inductor cannot be asked whether it holds this model's), else "empty"."""
    compiled_before = any(way != EAGER for way in runs)
    return "kept" if compiled_before and compiling.cache_holds_files() else "empty"


def _steps(measured: dict[str, float], seconds: float) -> int:
    """The steps a run that measured ``measured`` (``record_run``) holds in a budget of ``seconds``."""
    return int(measured["steps_per_s"] * max(seconds - measured["first_step_s"], 0.0))


def record_run(kind: str, choice: CompileChoice, first_step_s: float, steps_per_s: float) -> None:
    """Keep what a CPU `minutes` run of ``kind`` measured in the machine record, under the way it ran: the
    seconds of its budget until its first step ended (compiling, the first grid) and its steps per second
    after that. The record keeps the best of each over the runs, as the probes keep their best of three:
    a busy moment slows a run, nothing speeds one."""

    def best(kept: dict[str, float] | None) -> dict[str, float]:
        if kept is None:
            return {"first_step_s": round(first_step_s, 2), "steps_per_s": round(steps_per_s, 3), "runs": 1}
        return {
            "first_step_s": min(kept["first_step_s"], round(first_step_s, 2)),
            "steps_per_s": max(kept["steps_per_s"], round(steps_per_s, 3)),
            "runs": kept.get("runs", 0) + 1,
        }

    machine.keep_run(kind, choice.way, best)


def resolve_compile(flag: str | bool, device: torch.device, minutes: float | None = None) -> bool:
    """Whether a run compiles, where no kind of run is known (sampling, ``choose_compile`` without ``kind``):
    on CUDA, and on a CPU with a C++ compiler for a `minutes` run of at least ``COMPILE_CPU_MINUTES``."""
    return choose_compile(flag, device, minutes).compiles


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass, or nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


def make_grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """Loss scaling keeps small fp16 gradients from flushing to zero; a no-op in any other mode."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def maybe_compile(model: nn.Module, enabled: bool) -> Callable[..., torch.Tensor]:
    """``torch.compile`` at the call site, never inside the model's code, so checkpoints hold plain weights:
    on a CPU the repeated blocks each in place (regional compilation, a shorter cold start), on CUDA the
    whole model; compiled kernels are kept between runs, and a cache that cannot be used costs speed, not
    the run (``tinydit.compiling``).

    The compiled wrapper shares its parameters with ``model``: save and load ``model`` itself.
    """
    if not enabled:
        return model
    compiling.use_cache_dir()
    # The backward is compiled with the forward, not at the first backward pass, so that a compile cache
    # that fails does so inside the guarded call (tinydit.compiling.CompileGuard).
    import torch._functorch.config  # (torch imports it lazily)

    torch._functorch.config.force_non_lazy_backward_lowering = True
    if any(p.device.type == "cpu" for p in model.parameters()):
        for switch in _SWITCHES:  # probes run here, eagerly, so compiled code only reads their answers
            if switch.warm_up is not None:
                switch.warm_up()
        # Inductor's C++ toolchain lookup warns "No CUDA runtime is found" on every CPU-only machine.
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        if compile_scope() == "blocks" and compiling.repeated_blocks(model):
            compiling.compile_regions(model)  # in place: the model itself is the compiled forward
            return model
    return compiling.GuardedCompile(model, torch.compile(model))


def compile_scope() -> str:
    """What a CPU compiles (``COMPILE_SCOPES``): ``TINYDIT_COMPILE_SCOPE``, else the repeated blocks."""
    scope = os.environ.get("TINYDIT_COMPILE_SCOPE") or "blocks"
    if scope not in COMPILE_SCOPES:
        raise TinyDiTError(f"TINYDIT_COMPILE_SCOPE must be one of {', '.join(COMPILE_SCOPES)}, got {scope!r}")
    return scope
