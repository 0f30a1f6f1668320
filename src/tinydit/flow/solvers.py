"""The samplers' integrators: each walks a velocity field over a time grid, from noise (t = 1) to data
(t = 0). ``tinydit.flow.samplers.sample`` runs them as a ``SamplingSettings`` says; they take the settings'
values checked there (``tinydit.flow.settings``) and do not check them again.

See ``tinydit.flow.path`` for the time convention. Every sampler has one signature, as k-diffusion's
``sample_euler(model, x, sigmas, callback=...)`` and flow_matching's ``ODESolver.sample(time_grid=...)``:

    sampler(velocity, x, grid, *, on_step=None, **options) -> x

    velocity: v = velocity(x, t), the field dx/dt at a float time t (``tinydit.flow.guidance.Velocity``: the
              model, guided where asked, counting its evaluations);
    x: (N, C, H, W) at t = grid[0];  grid: (steps + 1,) times falling from grid[0] to grid[-1]
    (``tinydit.flow.grids``: 1 -> 0);  returns x: (N, C, H, W) at t = grid[-1].
    on_step(i, t, x, x0): called after each step i = 0, 1, ... (dopri5: each accepted step) with x, the
              state (N, C, H, W) at the time t it reached, and x0, the clean image the step predicted from
              where it began, x_s - s v(x_s, s) on the straight path; the last call's x is the returned x.
              For a progress view, or the trajectory ``tinydit sample --trajectory`` draws.

``SAMPLERS`` names them:

    euler       1st order, 1 velocity per step
    heun        2nd order (trapezoidal predictor-corrector), 2 per step, 1 for a last (Euler) step to t = 0
    midpoint    2nd order (explicit midpoint), 2 per step; never evaluates the field at t = 0
    heun-first  Euler with a Heun step out of the noise (t = 1): 1 velocity per step, 2 for the first
    ancestral   stochastic (DDIM's eta family on the straight path), 1 velocity per step; ``eta`` = 0 is Euler
    dopri5      Dormand-Prince 5(4), adaptive steps under ``rtol``/``atol``; the grid sets only the ends and
                the first trial step
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable

import torch

from tinydit.errors import TinyDiTError
from tinydit.flow.guidance import Velocity

__all__ = [
    "SAMPLERS",
    "SAMPLER_NAMES",
    "FIXED_STEP_SAMPLERS",
    "OnStep",
    "euler",
    "heun",
    "midpoint",
    "heun_first",
    "ancestral",
    "dopri5",
    "DEFAULT_TOL",
    "DEFAULT_ETA",
]

Field = Callable[[torch.Tensor, float], torch.Tensor]  # v = velocity(x, t); Velocity also takes d=, the step
# (x_next, v) = step(velocity, x, t, t_next), v the velocity at (x, t) that the step began with
Step = Callable[[Field, torch.Tensor, float, float], tuple[torch.Tensor, torch.Tensor]]
OnStep = Callable[[int, float, torch.Tensor, torch.Tensor], None]  # on_step(i, t, x, x0), see above


def _times(grid: torch.Tensor) -> list[float]:
    """The grid as floats, after checking that it is one falling sequence of at least two times."""
    if not torch.is_tensor(grid) or grid.dim() != 1 or len(grid) < 2:
        raise TinyDiTError(
            f"a time grid is a 1-D tensor of at least 2 times (steps + 1), got "
            f"{tuple(grid.shape) if torch.is_tensor(grid) else type(grid).__name__}"
        )
    ts = grid.tolist()
    if not all(a > b for a, b in zip(ts[:-1], ts[1:], strict=False)) or ts[0] > 1 or ts[-1] < 0:
        raise TinyDiTError(f"a time grid falls strictly from at most 1 (noise) to at least 0 (data), got {ts}")
    return ts


def _walk(step: Step, velocity: Field, x: torch.Tensor, grid: torch.Tensor, on_step: OnStep | None) -> torch.Tensor:
    """Walk the grid with ``step(velocity, x, t, t_next) -> (x_next, v)``, telling ``on_step`` each step."""
    ts = _times(grid)
    for i, (t, t_next) in enumerate(zip(ts[:-1], ts[1:], strict=True)):
        x_next, v = step(velocity, x, t, t_next)
        if on_step is not None:
            on_step(i, t_next, x_next, x - t * v)
        x = x_next
    return x


# --- fixed-step samplers ------------------------------------------------------------------------------------


def _euler_step(f: Field, x: torch.Tensor, t: float, t_next: float) -> tuple[torch.Tensor, torch.Tensor]:
    # dt = t_next - t is negative: from noise to data. A shortcut model is told the step's size |dt|.
    v = f(x, t, d=t - t_next) if isinstance(f, Velocity) else f(x, t)
    return x + (t_next - t) * v, v


def _heun_step(f: Field, x: torch.Tensor, t: float, t_next: float) -> tuple[torch.Tensor, torch.Tensor]:
    dt = t_next - t
    v = f(x, t)
    x_pred = x + dt * v  # the Euler predictor
    return (x + dt * 0.5 * (v + f(x_pred, t_next)) if t_next > 0 else x_pred), v


def _midpoint_step(f: Field, x: torch.Tensor, t: float, t_next: float) -> tuple[torch.Tensor, torch.Tensor]:
    dt = t_next - t
    v = f(x, t)
    x_mid = x + 0.5 * dt * v
    return x + dt * f(x_mid, t + 0.5 * dt), v


def _heun_first_step(f: Field, x: torch.Tensor, t: float, t_next: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _heun_step(f, x, t, t_next) if t == 1.0 else _euler_step(f, x, t, t_next)  # grids start at 1 exactly


@torch.no_grad()
def euler(velocity: Field, x: torch.Tensor, grid: torch.Tensor, *, on_step: OnStep | None = None) -> torch.Tensor:
    """Euler's method on dx/dt = v: x_{t + dt} = x_t + dt v(x_t, t), with dt < 0. Order 1.

    With a shortcut model each step also tells the model its size |dt|, which is how shortcut models
    take 1, 2 or 4 large steps (``tinydit.flow.shortcut``)."""
    return _walk(_euler_step, velocity, x, grid, on_step)


@torch.no_grad()
def heun(velocity: Field, x: torch.Tensor, grid: torch.Tensor, *, on_step: OnStep | None = None) -> torch.Tensor:
    """Heun's method (Karras et al. 2022, alg. 1): an Euler predictor, then the trapezoidal corrector
    x_{t + dt} = x_t + dt (v(x_t, t) + v(x_pred, t + dt)) / 2. Order 2; 2 steps - 1 velocities on a grid to 0.

    As in Karras et al., a last step to t = 0 is a plain Euler step, so the model is never asked
    for the velocity at t = 0. Near the data the field is nearly singular (v = (x - E[x0 | x]) / t
    off the data), so the corrector's evaluation there at the predictor's off-data point hurts, most at
    few steps. One Euler step adds an O(dt^2) error once, so the method stays second order.
    """
    return _walk(_heun_step, velocity, x, grid, on_step)


@torch.no_grad()
def midpoint(velocity: Field, x: torch.Tensor, grid: torch.Tensor, *, on_step: OnStep | None = None) -> torch.Tensor:
    """The explicit midpoint method: x_{t + dt} = x_t + dt v(x_t + dt/2 v(x_t, t), t + dt/2). Order 2,
    two velocities per step, none at t = 0."""
    return _walk(_midpoint_step, velocity, x, grid, on_step)


@torch.no_grad()
def heun_first(velocity: Field, x: torch.Tensor, grid: torch.Tensor, *, on_step: OnStep | None = None) -> torch.Tensor:
    """Euler's method whose step out of the pure noise at t = 1 is a Heun step: steps + 1 velocities
    (steps when the only step ends at t = 0, which stays Euler, as in ``heun``).

    On a small Fashion-MNIST model the first step, out of the noise, was where Euler lost the most, and
    this sampler beat both Euler and Heun at about 20 evaluations; on a larger one Heun gained far more,
    so measure on your own model. With a guidance interval below t = 1 the extra
    velocity is unguided, so it costs one evaluation. Still order 1: the later steps are Euler's.
    """
    return _walk(_heun_first_step, velocity, x, grid, on_step)


# --- the adaptive sampler: Dormand-Prince 5(4) --------------------------------------------------------------

# Butcher tableau of Dormand & Prince (1980). Row 7 is the 5th-order solution itself, so the last
# stage of an accepted step is the first stage of the next ("first same as last", FSAL).
_C = (0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0)
_A = (
    (),
    (1 / 5,),
    (3 / 40, 9 / 40),
    (44 / 45, -56 / 15, 32 / 9),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
    (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
)
_B4 = (5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40)  # the embedded 4th order
_E = tuple(b5 - b4 for b5, b4 in zip((*_A[6], 0.0), _B4, strict=True))  # 5th minus 4th order weights
DEFAULT_TOL = 1e-3  # dopri5's default rtol and atol: per step, 1/8 of an 8-bit level (2/255 in [-1, 1])
MAX_DOPRI5_STEPS = 10_000  # attempted steps; a learned field that needs more is not being integrated


def _combine(weights: tuple[float, ...], ks: list[torch.Tensor]) -> torch.Tensor:
    return sum(w * k for w, k in zip(weights, ks, strict=False) if w != 0.0)  # (N, C, H, W)


def _dopri5_piece(
    f: Field,
    x: torch.Tensor,
    t0: float,
    t1: float,
    size: float,
    rtol: float,
    atol: float,
    accepted: Callable[[float, torch.Tensor, torch.Tensor], None] | None,
) -> tuple[torch.Tensor, float]:
    """Integrate from t0 down to t1 < t0 with a smooth field; returns x at t1 and the next step size.
    ``accepted(t, x, x0)`` sees each accepted step (``on_step`` without its count)."""
    t, k1, attempts = t0, f(x, t0), 0
    while t > t1:
        last = size >= t - t1
        dt = -(t - t1) if last else -size  # negative: towards the data
        ks = [k1]
        for i in range(1, 7):
            x_i = x + dt * _combine(_A[i], ks)
            ks.append(f(x_i, t + _C[i] * dt))
        x_new = x_i  # stage 7 was evaluated at the 5th-order solution
        # Error estimate per image, an RMS norm scaled by the tolerances (Hairer et al., eq. II.4.11);
        # the step must satisfy the worst image of the batch, so each image meets the tolerance.
        scale = atol + rtol * torch.maximum(x.abs(), x_new.abs())
        err = (dt * _combine(_E, ks) / scale).flatten(1).pow(2).mean(1).sqrt().max().item()
        if err <= 1.0:  # accept
            if accepted is not None:
                accepted(t1 if last else t + dt, x_new, x - t * k1)
            t, x, k1 = (t1 if last else t + dt), x_new, ks[6]
        # The next step: err scales as size^5, aim at 0.9 of the tolerance, change size by 1/5x to 10x (never
        # grow right after a rejection); a NaN error shrinks the step.
        factor = 0.2 if not math.isfinite(err) else 10.0 if err == 0 else 0.9 * err ** (-1 / 5)
        size = abs(dt) * min(10.0 if err <= 1.0 else 1.0, max(0.2, factor))
        attempts += 1
        if attempts > MAX_DOPRI5_STEPS:
            raise TinyDiTError(
                f"dopri5 needed more than {MAX_DOPRI5_STEPS} steps between t = {t0:g} and "
                f"{t1:g} (stuck at t = {t:.3g}); loosen `rtol`/`atol` or use a fixed-step sampler"
            )
    return x, size


@torch.no_grad()
def dopri5(
    velocity: Field,
    x: torch.Tensor,
    grid: torch.Tensor,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    on_step: OnStep | None = None,
) -> torch.Tensor:
    """Dormand-Prince 5(4) with FSAL and error-per-step control (Hairer, Norsett & Wanner, sec. II.4).

    The step size adapts so that each image's local error stays within ``atol + rtol |x|`` (RMS over
    its pixels), both 1e-3 by default. The grid sets only the ends (grid[0], grid[-1]) and the first trial
    step (its first interval). Where a ``Velocity``'s guidance switches on or off (the ends of its interval)
    the field jumps, so the solver stops there and restarts; each piece is smooth. The steps are shared by
    the batch, so an image can come out slightly differently (within the tolerance) in another batch. An
    x-prediction model's field below its clip of t is crossed in one Euler step
    (``tinydit.flow.guidance.unclipped_scale``).
    """
    rtol, atol = DEFAULT_TOL if rtol is None else rtol, DEFAULT_TOL if atol is None else atol
    ts = _times(grid)
    start, end, size = ts[0], ts[-1], ts[0] - ts[1]
    # Below an x-prediction's singular_below the field is (x - x0) / t, too stiff for adaptive steps: one
    # Euler step crosses it, which for x0 held fixed is the path's exact step (it lands on x0 at t = 0).
    singular = velocity.singular_below if isinstance(velocity, Velocity) else 0.0
    stop = singular if end < singular < start else end
    guided = isinstance(velocity, Velocity) and velocity.cfg_scale != 1.0
    switches = sorted({v for v in (velocity.lo, velocity.hi) if stop < v < start}, reverse=True) if guided else []
    ends = [start, *switches, stop]
    count = itertools.count()
    accepted = (lambda t, x, x0: on_step(next(count), t, x, x0)) if on_step is not None else None
    for t0, t1 in zip(ends[:-1], ends[1:], strict=True):
        # Guidance held on or off over the whole piece: its ends (where the interval starts or stops) are
        # evaluated as its inside, so each piece is smooth.
        piece = functools.partial(velocity, guided=velocity.guided_at(0.5 * (t0 + t1))) if guided else velocity
        x, size = _dopri5_piece(piece, x, t0, t1, size, rtol, atol, accepted)
    if stop > end:
        x_next, v = _euler_step(velocity, x, stop, end)
        if accepted is not None:
            accepted(end, x_next, x - stop * v)
        x = x_next
    return x


# --- the stochastic sampler -------------------------------------------------------------------------------------

DEFAULT_ETA = 1.0


@torch.no_grad()
def ancestral(
    velocity: Field,
    x: torch.Tensor,
    grid: torch.Tensor,
    *,
    eta: float | None = None,
    generator: torch.Generator | None = None,
    on_step: OnStep | None = None,
) -> torch.Tensor:
    """Ancestral sampling: DDIM's eta family (Song et al. 2021, eq. 12) on the straight path x_t = (1 - t) x0 + t eps.

    Each step evaluates the velocity once and splits x_t into its predictions x0 = x - t v and
    eps = x + (1 - t) v; the next state puts them back at t' with part of the noise drawn afresh,

        x' = (1 - t') x0 + sqrt(t'^2 - s^2) eps + s z,   z ~ N(0, I),
        s  = eta t' sqrt(1 - r^2),   r = (1 - t) t' / ((1 - t') t),

    where eta = 1 is the DDPM posterior's noise and eta = 0 is Euler's step exactly. The fresh noise lets
    later steps correct what earlier ones drew inconsistently (parts of one shape in two places), which a
    deterministic path keeps. A last step to t = 0 is x0. ``generator`` (CPU) draws the noise;
    ``generate`` passes one seeded from its seed.
    """
    eta = DEFAULT_ETA if eta is None else eta

    def step(f: Field, x: torch.Tensor, t: float, t_next: float) -> tuple[torch.Tensor, torch.Tensor]:
        v = f(x, t)
        x0, eps = x - t * v, x + (1.0 - t) * v  # (N, C, H, W) each
        if t_next <= 0.0:
            return x0, v
        r = (1.0 - t) * t_next / ((1.0 - t_next) * t)
        s = eta * t_next * math.sqrt(max(0.0, 1.0 - r * r))
        z = torch.randn(x.shape, generator=generator).to(x.device, x.dtype)  # drawn on the CPU, as generate's noise
        return (1.0 - t_next) * x0 + math.sqrt(max(0.0, t_next**2 - s**2)) * eps + s * z, v

    return _walk(step, velocity, x, grid, on_step)


# --- the registry ---------------------------------------------------------------------------------------------

SAMPLERS: dict[str, Callable[..., torch.Tensor]] = {
    "euler": euler,
    "heun": heun,
    "midpoint": midpoint,
    "dopri5": dopri5,
    "ancestral": ancestral,
    "heun-first": heun_first,
}
SAMPLER_NAMES = tuple(SAMPLERS)
FIXED_STEP_SAMPLERS = ("euler", "heun", "midpoint")  # fixed-step and deterministic: their path can be recorded
