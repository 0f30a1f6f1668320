"""The samplers on analytic velocity fields with known solutions: exactness, convergence order, exact
model-evaluation counts, guidance and its interval, time grids and argument errors."""

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import sample_with
from torch import nn

from tinydit.errors import TinyDiTError
from tinydit.flow.generate import generate
from tinydit.flow.grids import GRIDS, shifted_grid, time_grid, uniform_grid
from tinydit.flow.guidance import Velocity
from tinydit.flow.samplers import SAMPLERS
from tinydit.flow.settings import SamplingSettings
from tinydit.models.dit import X_PRED_T_MIN, DiT, DiTConfig

ORDER = {"euler": 1, "heun": 2, "midpoint": 2, "heun-first": 1}  # the fixed-step samplers and their order
NFE = {
    "euler": lambda s: s,
    "heun": lambda s: 2 * s - 1,
    "midpoint": lambda s: 2 * s,  # Heun: last step Euler
    "heun-first": lambda s: s + 1,
}
DETERMINISTIC = {"ancestral": {"eta": 0.0}}  # options that make a stochastic sampler deterministic (Euler)


class Field(nn.Module):
    """A stand-in 'model' with a known velocity v = fn(x, t, y); records the batch size of each call."""

    def __init__(self, fn, n_classes=2, in_channels=1, img_size=2):
        super().__init__()
        self.fn = fn
        self.config = SimpleNamespace(n_classes=n_classes, in_channels=in_channels, img_size=img_size)
        self.anchor = nn.Parameter(torch.zeros(()))  # gives generate() a device to read
        self.batches: list[int] = []

    def forward(self, x, t, y):
        assert x.shape[0] == t.shape[0] == y.shape[0] and bool((t == t[0]).all())  # one time per batch
        self.batches.append(x.shape[0])
        return self.fn(x, t, y)

    def null_condition(self, y):
        return torch.full_like(y, self.config.n_classes)  # the null label, as DiT.null_condition


def exp_field(a=1.0):
    """dx/dt = a x: from x(1) = x1 the exact solution is x(0) = x1 exp(-a)."""
    return Field(lambda x, t, y: a * x)


def cos_field():
    """dx/dt = cos(t) x, time-dependent: x(0) = x1 exp(sin 0 - sin 1) = x1 exp(-sin 1)."""
    return Field(lambda x, t, y: torch.cos(t).view(-1, 1, 1, 1) * x)


def x1_and_y(n=3, dtype=torch.float64):
    x1 = torch.linspace(0.5, 2.0, n * 4, dtype=dtype).view(n, 1, 2, 2)
    return x1, torch.zeros(n, dtype=torch.long)


def error(res, x1, exact_factor):
    return (res.x - x1 * exact_factor).abs().max().item()


@pytest.mark.parametrize("name", list(ORDER))
@pytest.mark.parametrize("field, factor", [(exp_field, math.exp(-1)), (cos_field, math.exp(-math.sin(1)))])
def test_fixed_step_samplers_converge_at_their_order(name, field, factor):
    x1, y = x1_and_y()
    errors = []
    for steps in (16, 32, 64, 128):
        f = field()
        res = sample_with(name, f, x1, y, steps)
        assert res.nfe == NFE[name](steps) and len(f.batches) == res.nfe
        errors.append(error(res, x1, factor))
    ratios = [a / b for a, b in zip(errors, errors[1:], strict=False)]
    expected = 2 ** ORDER[name]  # doubling the steps halves (order 1) or quarters (order 2) the error
    assert all(0.85 * expected < r < 1.15 * expected for r in ratios), (name, errors, ratios)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_straight_paths_are_exact_for_every_sampler(name):
    # A constant velocity is integrated exactly by all of them: x(0) = x1 - v.
    x1, y = x1_and_y()
    v = torch.tensor(0.3, dtype=torch.float64)
    res = sample_with(name, Field(lambda x, t, y: v.expand_as(x)), x1, y, 3, **DETERMINISTIC.get(name, {}))
    assert torch.allclose(res.x, x1 - v, atol=1e-12)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_every_sampler_takes_any_falling_grid_and_a_plain_field(name):
    # One signature, sampler(velocity, x, grid): an uneven grid that stops short of the data, and a plain
    # function of (x, t) as the field. dx/dt = v is exact on a straight path: x(0.1) = x1 - 0.9 v.
    x1, _ = x1_and_y()
    v = torch.tensor(0.3, dtype=torch.float64)
    grid = torch.tensor([1.0, 0.85, 0.4, 0.1], dtype=torch.float64)
    x = SAMPLERS[name](lambda x, t: v.expand_as(x), x1, grid, **DETERMINISTIC.get(name, {}))
    assert torch.allclose(x, x1 - 0.9 * v, atol=1e-12)
    # and on a curved field the result depends on the grid it is given (dopri5 only on its ends)
    field = lambda x, t: math.cos(t) * x  # noqa: E731
    fine = SAMPLERS[name](field, x1, uniform_grid(64), **DETERMINISTIC.get(name, {}))
    exact = x1 * math.exp(-math.sin(1))
    coarse = SAMPLERS[name](field, x1, uniform_grid(2), **DETERMINISTIC.get(name, {}))
    assert (fine - exact).abs().max() < (coarse - exact).abs().max() or name == "dopri5"


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_sample_is_the_sampler_on_the_named_grid_with_the_guided_field(name):
    x1, y = x1_and_y()
    opts = {"ancestral": {"eta": 0.5}, "dopri5": {"rtol": 1e-4, "atol": 1e-4}}.get(name, {})
    gen = {"generator": torch.Generator().manual_seed(3)} if name == "ancestral" else {}
    res = sample_with(
        name, cos_field(), x1, y, 6, 2.0, grid="shifted", shift=2.0, cfg_interval=(0.2, 0.7), **opts, **gen
    )
    velocity = Velocity(cos_field(), y, 2.0, (0.2, 0.7))
    gen = {"generator": torch.Generator().manual_seed(3)} if name == "ancestral" else {}
    x = SAMPLERS[name](velocity, x1, time_grid(6, "shifted", 2.0), **opts, **gen)
    assert torch.equal(res.x, x) and res.nfe == velocity.nfe > 0


@pytest.mark.parametrize(
    "grid, match",
    [
        (torch.tensor([[1.0, 0.0]]), "1-D tensor of at least 2 times"),
        (torch.tensor([1.0]), "1-D tensor of at least 2 times"),
        ([1.0, 0.0], "1-D tensor"),
        (torch.tensor([1.0, 0.5, 0.5, 0.0]), "falls strictly"),
        (torch.tensor([0.0, 1.0]), "falls strictly"),
        (torch.tensor([1.5, 0.0]), "at most 1"),
        (torch.tensor([1.0, -0.2]), "at least 0"),
    ],
)
def test_bad_grids_are_clear_errors(grid, match):
    for sampler in SAMPLERS.values():
        with pytest.raises(TinyDiTError, match=match):
            sampler(lambda x, t: -x, torch.zeros(1, 1, 2, 2), grid)


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_heun_first_takes_one_heun_step_then_euler_steps(steps):
    # dx/dt = a x with h = -1/steps: an Euler step multiplies x by 1 + a h, a Heun step by 1 + a h + (a h)^2 / 2.
    a, h = 1.5, -1.0 / steps
    x1, y = x1_and_y()
    res = sample_with("heun-first", exp_field(a), x1, y, steps)
    first = 1 + a * h + (a * h) ** 2 / 2 if steps > 1 else 1 + a * h  # one step only: it ends at t = 0, Euler
    assert torch.allclose(res.x, x1 * first * (1 + a * h) ** (steps - 1), rtol=1e-12, atol=0)
    assert res.nfe == (steps + 1 if steps > 1 else 1)
    guided = sample_with("heun-first", exp_field(a), x1, y, 5, 2.0, cfg_interval=(0.1, 0.7))  # grid 1, 0.8, ..., 0.2
    assert guided.nfe == 6 + 3  # velocities at 1, 0.8 (corrector), 0.8, 0.6, 0.4, 0.2; the last 3 guided


def test_dopri5_meets_its_tolerance_with_fewer_evaluations_than_fixed_steps():
    x1, y = x1_and_y()
    factor = math.exp(-math.sin(1))
    res = sample_with("dopri5", cos_field(), x1, y, rtol=1e-6, atol=1e-6)
    err = error(res, x1, factor)
    assert err < 1e-5 and (res.nfe - 1) % 6 == 0  # FSAL: one first evaluation, then 6 per attempted step
    tighter = sample_with("dopri5", cos_field(), x1, y, rtol=1e-9, atol=1e-9)
    assert error(tighter, x1, factor) < 1e-8 and tighter.nfe > res.nfe
    heun = sample_with("heun", cos_field(), x1, y, res.nfe // 2)  # Heun with the same budget is far less accurate
    assert error(heun, x1, factor) > 10 * err
    steps = 16
    while error(sample_with("heun", cos_field(), x1, y, steps), x1, factor) > err:
        steps *= 2
    assert 2 * steps > 3 * res.nfe  # Heun needs several times the evaluations to match dopri5


def test_dopri5_rejects_steps_that_are_too_long_and_counts_them():
    # A fast-decaying field and a first trial step over the whole interval (steps=1): accepted, it
    # would take 7 evaluations; it is rejected and the solver goes on in shorter steps.
    x1, y = x1_and_y()
    f = exp_field(20.0)
    res = sample_with("dopri5", f, x1, y, steps=1, rtol=1e-6, atol=1e-6)
    assert error(res, x1, math.exp(-20.0)) < 2e-6
    assert res.nfe > 7 and res.nfe == len(f.batches) and (res.nfe - 1) % 6 == 0


def test_guided_velocity_is_one_batched_forward():
    # v_cond = 1, v_uncond = -1 (the null class is 2): v = -1 + s (1 - (-1)) = 2 s - 1.
    f = Field(lambda x, t, y: torch.where(y == 2, -1.0, 1.0).view(-1, 1, 1, 1).expand_as(x).to(x.dtype))
    x1, y = x1_and_y(n=3)
    res = sample_with("euler", f, x1, y, steps=4, cfg_scale=3.0)
    assert torch.allclose(res.x, x1 - 5.0)  # x(0) = x1 - (2 s - 1) over a unit of time
    assert res.nfe == 8 and f.batches == [6] * 4  # two evaluations per image per step, one call of 2N


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_guidance_interval_counts_one_evaluation_outside_it(name):
    # v_cond = 1, v_uncond = -1, s = 2: the velocity is 3 inside [0.25, 0.75] and 1 outside, so
    # x(0) = x1 - (0.5 * 3 + 0.5 * 1) = x1 - 2 for an exact integrator of this piecewise constant field.
    f = Field(lambda x, t, y: torch.where(y == 2, -1.0, 1.0).view(-1, 1, 1, 1).expand_as(x).to(x.dtype))
    x1, y = x1_and_y(n=2)
    opts = DETERMINISTIC.get(name, {})
    res = sample_with(name, f, x1, y, 8, 2.0, cfg_interval=(0.25, 0.75), **opts)
    guided = sum(b == 4 for b in f.batches)
    assert res.nfe == len(f.batches) + guided  # 2 per guided evaluation, 1 per conditional-only one
    if name in ("euler", "ancestral"):  # grid 1, 7/8, ..., 1/8: guided at 3/4, 5/8, 1/2, 3/8, 1/4
        assert guided == 5 and res.nfe == 13
        assert torch.allclose(res.x, x1 - (5 * 3 + 3 * 1) / 8)
    if name == "dopri5":  # it stops at the switches, so it integrates the jump exactly
        assert torch.allclose(res.x, x1 - 2.0, atol=1e-9)
    whole = sample_with(name, f, x1, y, 8, 2.0, cfg_interval=(0.0, 1.0), **opts)
    off = sample_with(name, f, x1, y, 8, 1.0, cfg_interval=(0.25, 0.75), **opts)
    assert torch.allclose(whole.x, x1 - 3.0) and torch.allclose(off.x, x1 - 1.0)
    assert off.nfe * 2 == whole.nfe  # the same steps, each guided (2 evaluations) or not (1)


def gaussian_field(mu: float, s: float):
    """The exact velocity for data x0 ~ N(mu, s^2) per element: with x_t = (1 - t) x0 + t eps and
    var = (1 - t)^2 s^2 + t^2, E[x0 | x_t] = mu + (1 - t) s^2 (x_t - (1 - t) mu) / var and
    E[eps | x_t] = t (x_t - (1 - t) mu) / var; v = E[eps - x0 | x_t]."""

    def v(x, t, y):
        t = t.view(-1, 1, 1, 1).to(x.dtype)
        dev = (x - (1 - t) * mu) / ((1 - t) ** 2 * s**2 + t**2)
        return t * dev - (mu + (1 - t) * s**2 * dev)

    return Field(v)


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_ancestral_sampling_draws_the_data_distribution(eta):
    # Every eta keeps the marginals of the straight path, so with the exact field and small steps the
    # samples follow N(mu, s^2) (std error of the mean 0.005, of the std about 0.5%, with 20,000
    # numbers; at 32 steps the std is still 5-10% short, the first-order steps' error).
    mu, s = 0.5, 0.3
    noise = torch.randn(5000, 1, 2, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.zeros(5000, dtype=torch.long)
    res = sample_with(
        "ancestral", gaussian_field(mu, s), noise, y, 512, eta=eta, generator=torch.Generator().manual_seed(1)
    )
    assert res.nfe == 512
    assert abs(res.x.mean().item() - mu) < 0.02 and abs(res.x.std().item() / s - 1) < 0.03, (res.x.mean(), res.x.std())
    if eta > 0:  # the fresh noise matters: each image moved away from its deterministic (Euler) path
        euler = sample_with("euler", gaussian_field(mu, s), noise, y, 512)
        assert (res.x - euler.x).abs().mean() > 0.05 * s


def test_ancestral_noise_that_is_too_small_shrinks_the_samples(monkeypatch):
    # The test above can fail: the same sampler with half the fresh noise it draws (s z / 2 in place of
    # s z, the eps term unchanged) gives samples that are too narrow.
    mu, s = 0.5, 0.3
    noise = torch.randn(5000, 1, 2, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.zeros(5000, dtype=torch.long)
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, **k: 0.5 * randn(*a, **k))  # only the sampler draws from here on
    res = sample_with(
        "ancestral", gaussian_field(mu, s), noise, y, 512, eta=1.0, generator=torch.Generator().manual_seed(1)
    )
    assert res.x.std().item() / s < 0.9


def test_ancestral_at_eta_0_is_euler_and_is_seeded_by_generate():
    x1, y = x1_and_y()
    a = sample_with("ancestral", cos_field(), x1, y, 8, 2.0, eta=0.0, cfg_interval=(0.2, 0.8))
    b = sample_with("euler", cos_field(), x1, y, 8, 2.0, cfg_interval=(0.2, 0.8))
    assert torch.allclose(a.x, b.x, atol=1e-12) and a.nfe == b.nfe
    f = Field(lambda x, t, y: -x, n_classes=4)
    labels = torch.arange(6) % 4
    ancestral = SamplingSettings("ancestral", 4, 1.0)
    one = generate(f, labels, ancestral, seed=3)
    again = generate(f, labels, ancestral, seed=3)
    other = generate(f, labels, ancestral, seed=4)
    assert torch.equal(one.x, again.x) and not torch.allclose(one.x, other.x) and one.nfe == 4


def test_grids_run_from_noise_to_data():
    assert time_grid(4).tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert set(GRIDS) == {"uniform", "shifted"}
    s = shifted_grid(8, 3.0)
    assert s[0] == 1 and s[-1] == 0 and bool((s[1:] < s[:-1]).all())
    steps = s[:-1] - s[1:]
    assert steps[0] < steps[-1]  # shift > 1: short steps near the noise, long near the data
    assert math.isclose(s[4].item(), 0.75)  # t = 1/2 maps to s / (s + 1)
    assert torch.allclose(shifted_grid(8, 1.0), uniform_grid(8))
    assert torch.equal(time_grid(8, "shifted"), shifted_grid(8, 3.0))


def test_shifted_grid_changes_the_samples_but_not_the_count():
    x1, y = x1_and_y()
    a = sample_with("euler", cos_field(), x1, y, 8)
    b = sample_with("euler", cos_field(), x1, y, 8, grid="shifted", shift=3.0)
    assert a.nfe == b.nfe == 8 and not torch.allclose(a.x, b.x)


def test_generate_batches_and_reports_nfe():
    f = Field(lambda x, t, y: -x, n_classes=4)
    y = torch.arange(5) % 4
    heun = SamplingSettings("heun", 3, 2.0)
    a = generate(f, y, heun, seed=1, batch_size=2)
    b = generate(f, y, heun, seed=1)
    assert torch.allclose(a.x, b.x) and a.nfe == b.nfe == 10 and a.x.shape == (5, 1, 2, 2)  # 2 x (2 x 3 - 1)
    c = generate(f, y, SamplingSettings("dopri5", 3, 1.0, rtol=1e-5, atol=1e-5), seed=1)
    noise = torch.randn(5, 1, 2, 2, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(c.x, noise * math.e, atol=1e-4)  # dx/dt = -x from t = 1 to 0: x(0) = e x(1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(steps=0), "`steps` must be >= 1"),
        (dict(cfg_scale=-1.0), "`cfg_scale` .*must be >= 0"),
        (dict(cfg_scale=float("nan")), "`cfg_scale` .*must be >= 0"),
        (dict(sampler="rk4"), "unknown sampler 'rk4': use one of euler, heun, midpoint, dopri5"),
        (dict(grid="karras"), "unknown time grid 'karras': use one of uniform, shifted"),
        (dict(shift=3.0), "`shift` applies to the shifted grid only"),
        (dict(grid="shifted", shift=0.0), "`shift` must be a positive number"),
        (dict(cfg_interval=(0.8, 0.2)), "`cfg_interval` LO HI needs 0 <= LO <= HI <= 1"),
        (dict(cfg_interval=(-0.1, 0.5)), "`cfg_interval`"),
        (dict(rtol=1e-3), "`rtol` applies to the adaptive sampler only"),
        (dict(sampler="dopri5", atol=0.0), "`atol` must be a positive number"),
        (dict(eta=0.5), "`eta` applies to the stochastic sampler only"),
        (dict(sampler="ancestral", eta=1.5), "`eta` must be in \\[0, 1\\]"),
    ],
)
def test_bad_sampler_arguments_are_clear_errors(kwargs, match):
    args = {"steps": 4, "cfg_scale": 1.0, **kwargs}
    with pytest.raises(TinyDiTError, match=match):
        SamplingSettings(**args)  # checked once, where the settings are made


@pytest.mark.parametrize("name", [*ORDER, "ancestral"])
def test_on_step_sees_every_step_and_its_last_x_is_the_sample(name):
    """on_step(i, t, x, x0): once per step, x at the grid's next time, x0 = x_s - s v(x_s, s) from where the
    step began (dx/dt = a x: v = a x), and the last x is the returned one."""
    a, steps = 1.5, 5
    x1, y = x1_and_y()
    calls = []
    opts = {"eta": 0.5, "generator": torch.Generator().manual_seed(0)} if name == "ancestral" else {}
    res = sample_with(name, exp_field(a), x1, y, steps, on_step=lambda *args: calls.append(args), **opts)
    grid = time_grid(steps).tolist()
    assert [c[0] for c in calls] == list(range(steps)) and [c[1] for c in calls] == grid[1:]
    assert torch.equal(calls[-1][2], res.x)
    starts = [x1] + [c[2] for c in calls[:-1]]  # x at the time each step began
    for (_, _, _, x0), x_s, s in zip(calls, starts, grid[:-1], strict=True):
        torch.testing.assert_close(x0, x_s - s * a * x_s)


def test_on_step_sees_each_accepted_dopri5_step():
    a, x1, y = 1.5, *x1_and_y()
    calls = []
    res = sample_with("dopri5", exp_field(a), x1, y, 2, rtol=1e-6, atol=1e-6, on_step=lambda *c: calls.append(c))
    ts = [c[1] for c in calls]
    assert [c[0] for c in calls] == list(range(len(calls))) and len(calls) > 2
    assert all(s > t for s, t in zip([1.0, *ts[:-1]], ts, strict=True)) and ts[-1] == 0.0  # never a rejected step
    assert (res.nfe - 1) / 6 >= len(calls)  # 6 evaluations per attempted step, after the first
    for _, t, x, _ in calls:  # each x is the accepted state at its time: x(t) = x1 exp(a (t - 1))
        torch.testing.assert_close(x, x1 * math.exp(a * (t - 1)), rtol=1e-4, atol=1e-5)
    assert torch.equal(calls[-1][2], res.x)


@pytest.mark.parametrize("name", ["euler", "heun", "heun-first", "ancestral", "dopri5"])
def test_an_x_prediction_models_last_step_lands_on_its_predicted_image(name):
    """Below t = X_PRED_T_MIN the model clips t in v = (x - x0) / t; the samplers undo the clip, so a last
    step from t = 1/32 to 0 returns the model's own x0 (its output), not a mix of it with x_t's noise."""
    torch.manual_seed(0)
    model = DiT(DiTConfig(img_size=8, in_channels=3, patch_size=4, dim=32, depth=1, n_heads=2, pred="x")).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.05)
    outputs = []  # the network's output image at each evaluation: the model's x0
    model.velocity = lambda x, t, out, velocity=model.velocity: outputs.append(out) or velocity(x, t, out)
    noise, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
    opts = {"generator": torch.Generator().manual_seed(0)} if name == "ancestral" else {}
    states = []
    res = sample_with(name, model, noise, y, 32, on_step=lambda i, t, x, x0: states.append(x), **opts)
    torch.testing.assert_close(res.x, outputs[-1], rtol=0, atol=1e-5)
    if name == "dopri5":  # it crossed t < X_PRED_T_MIN in one step, where (x - x0) / t is too stiff to adapt to
        assert len(states) < 32 and res.nfe == len(outputs)
        return
    x_s, s = states[-2], 1 / 32  # the clipped field's last step goes only s / X_PRED_T_MIN of the way
    clipped = x_s + (s / X_PRED_T_MIN) * (outputs[-1] - x_s)
    assert (clipped - res.x).abs().max() > 0.02  # the negative control (over 2 uint8 levels): the clipped field
    with torch.no_grad():  # above the clip the field is the model's velocity as it is
        t = torch.full((2,), 0.3)
        torch.testing.assert_close(Velocity(model, y)(noise, 0.3), model(noise, t, y))


def test_x_prediction_divides_by_t_in_float32_under_bf16():
    model = DiT(DiTConfig(img_size=8, in_channels=3, patch_size=4, dim=32, depth=1, n_heads=2, pred="x"))
    x, out = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8).to(torch.bfloat16)  # out: as autocast makes it
    t = torch.tensor([0.3, 0.7])
    v = model.velocity(x, t, out)
    assert v.dtype == torch.float32
    torch.testing.assert_close(v, (x - out.float()) / t.view(-1, 1, 1, 1), rtol=1e-6, atol=1e-6)
