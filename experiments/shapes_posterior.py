"""Measure a shapes model against the empirical posterior mean of its training set.

    python experiments/shapes_posterior.py losses runs/shapes/checkpoint.pt
    python experiments/shapes_posterior.py hybrid runs/shapes/checkpoint.pt --switch 0.8 0.7 --cfg 1 4 --eta 0 1
    python experiments/shapes_posterior.py denoise runs/shapes/checkpoint.pt --n 400 --t 0.3 0.5 0.7 0.9
    python experiments/shapes_posterior.py keep runs/shapes/checkpoint.pt --n 400 --t 0.5 0.7 0.8 --steps 32

The empirical posterior mean E[x0 | x_t] over the 20,000 training images (weights
exp(-|x_t - (1 - t) x0_i|^2 / 2 t^2), restricted to the asked class when the label is given) is a
predictor any model could in principle match, so its loss bounds from above what the best model of the
data achieves. Where its effective sample size is near 1 (t below about 0.8 on shapes) it snaps to one
training image and says little.

``losses``: the velocity loss on held-out images with fixed noise at several t, for the model with the true,
the null and a wrong label, and for the empirical posterior with and without the label (and its
effective sample size). The gap between "null" and "true" is what the model takes from the label.

``hybrid``: ancestral sampling (``eta`` 1: DDPM's noise, 0: Euler) whose x0 comes from the empirical class
posterior for t > ``switch`` and from the model below it (guidance ``cfg``), scored by the strict judge:
whether the model finishes shapes whose layout was laid out right.

``denoise``: no posterior: held-out real images of the run's classes noised to each t and denoised in one
step (x0 = x_t - t v, the right label), judged strictly: from which t on the model renders a shape it is
shown. Works for runs on a subset of the classes (``--classes cross``).

``keep``: the same held-out images noised to each t, then the model's own sampler from t down to 0 (Euler and
ancestral, ``--steps`` steps, the right label), judged strictly: whether the model's path keeps a layout
it is given. A perfect model keeps every one (its path carries the noised data to the data); what it
loses here it loses below t, whatever happened above.

``track``: the model's own Euler path from noise (guidance ``cfg``); at each knot t the strict judge reads
the model's x0 and the empirical class posterior's x0 at the same x_t: where the second still holds a
right shape and the first does not, the model has left what the data says at a point of its own path.
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from tinydit import api
from tinydit.data.shapes import SHAPES, ShapesDataset
from tinydit.eval.shape_fit import fit_shapes, strict_scores
from tinydit.flow.grids import uniform_grid
from tinydit.flow.guidance import guided_velocity
from tinydit.flow.samplers import SAMPLERS
from tinydit.images import from_uint8, to_uint8


class EmpiricalPosterior:
    """E[x0 | x_t (, y)] over a set of images X (M, C, H, W) with labels Y (M,)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.shape = images.shape[1:]
        self.x = images.flatten(1).float()  # (M, CHW)
        self.y = labels.long()
        self.sq = (self.x**2).sum(1)  # (M,)

    def __call__(self, x_t: torch.Tensor, t: float, y: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
        """x0 (N, C, H, W) and the median effective sample size of the weights."""
        xf, a = x_t.flatten(1).float(), 1.0 - t
        d = (xf**2).sum(1, keepdim=True) - 2 * a * xf @ self.x.T + a * a * self.sq[None]  # (N, M)
        logw = -d / (2 * t * t)
        if y is not None:
            logw = logw.masked_fill(self.y[None] != y[:, None], -math.inf)
        w = torch.softmax(logw, 1)
        ess = (1 / (w**2).sum(1)).median().item()
        return (w @ self.x).view(-1, *self.shape), ess


def losses(model, posterior: EmpiricalPosterior, n: int, times: list[float]) -> None:
    test = ShapesDataset(n=n, train=False)
    x0, y = from_uint8(test.images).float(), test.labels.long()
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(x0.shape, generator=g)
    wrong = (y + torch.randint(1, 4, y.shape, generator=g)) % 4
    target = noise - x0
    cross = y == 3
    for t in times:
        x_t, tt = (1 - t) * x0 + t * noise, torch.full((len(y),), t)
        row = {"t": t}
        with torch.no_grad():
            for name, label in (("true", y), ("null", torch.full_like(y, model.null_class)), ("wrong", wrong)):
                err = (model(x_t, tt, label) - target).pow(2).flatten(1).mean(1)
                row[name], row[name + "_cross"] = round(err.mean().item(), 4), round(err[cross].mean().item(), 4)
        for name, label in (("empirical_class", y), ("empirical_all", None)):
            m, ess = posterior(x_t, t, label)
            err = ((x_t - m) / t - target).pow(2).flatten(1).mean(1)
            row[name], row[name + "_cross"] = round(err.mean().item(), 4), round(err[cross].mean().item(), 4)
            row[name + "_ess"] = round(ess, 1)
        print(json.dumps(row), flush=True)


def held_out(classes: list[str], n: int, train: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n held-out images of a run's classes (N, 3, H, W), their kinds (index into SHAPES) and the run's labels;
    ``train``: the first n training images of those classes instead (a ``limit`` run's own, for n <= limit)."""
    test = ShapesDataset(n=20000) if train else ShapesDataset(n=4 * n, train=False)
    kinds = torch.tensor([SHAPES.index(c) for c in classes])  # the run's label i is the kind kinds[i]
    keep = torch.isin(test.labels.long(), kinds)
    x0, kind = from_uint8(test.images[keep][:n]).float(), test.labels.long()[keep][:n]
    return x0, kind, (kind[:, None] == kinds[None]).long().argmax(1)


def judged(x: torch.Tensor, kind: torch.Tensor, classes: list[str]) -> dict:
    """The strict pass rate of images x (N, 3, H, W) asked for kinds (N,), overall and per class."""
    passes = fit_shapes(to_uint8(x)).passes(kind.numpy())
    return {"strict": round(float(passes.mean()), 3)} | {
        c: round(float(passes[(kind == SHAPES.index(c)).numpy()].mean()), 3) for c in classes
    }


def denoise(model, classes: list[str], n: int, times: list[float]) -> None:
    x0, kind, label = held_out(classes, n)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    for t in times:
        x_t, tt = (1 - t) * x0 + t * noise, torch.full((len(kind),), t)
        with torch.no_grad():
            x0_hat = x_t - t * model(x_t, tt, label)
        print(json.dumps({"t": t, "n": len(kind), **judged(x0_hat, kind, classes)}), flush=True)


def keep(model, classes: list[str], n: int, times: list[float], steps: int, out: str | None, train: bool) -> None:
    x0, kind, label = held_out(classes, n, train)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))

    def velocity(x: torch.Tensor, t: float) -> torch.Tensor:
        with torch.no_grad():
            return model(x, torch.full((len(x),), float(t)), label)

    for t in times:
        x_t, grid = (1 - t) * x0 + t * noise, torch.linspace(t, 0, steps + 1)
        rows = [x0, x_t]
        for name, options in (
            ("euler", {}),
            ("ancestral", {"eta": 1.0, "generator": torch.Generator().manual_seed(1)}),
        ):
            rows.append(SAMPLERS[name](velocity, x_t.clone(), grid, **options))
            print(json.dumps({"t": t, "sampler": name, "n": len(kind), **judged(rows[-1], kind, classes)}), flush=True)
        if out and t == times[0]:  # the first ten crosses (else images): clean, noised to t, Euler, ancestral
            from torchvision.utils import save_image

            crosses = torch.nonzero(kind == SHAPES.index("cross")).flatten()
            pick = (crosses if len(crosses) else torch.arange(len(kind)))[:10]
            tiles = torch.cat([r[pick] for r in rows]).clamp(-1, 1)
            big = torch.nn.functional.interpolate((tiles + 1) / 2, scale_factor=4, mode="nearest")
            save_image(big, out, nrow=len(pick), padding=4, pad_value=1)


def hybrid(model, posterior: EmpiricalPosterior, n: int, switch: float, cfg: float, eta: float, steps: int) -> dict:
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 4

    def velocity(x: torch.Tensor, t: float) -> torch.Tensor:  # v = (x - x0) / t on the straight path
        if t > switch:
            return (x - posterior(x, t, y)[0]) / t
        return guided_velocity(model, x, torch.full((n,), t), y, cfg)[0]

    x = SAMPLERS["ancestral"](
        velocity, torch.randn(n, 3, 32, 32, generator=g), uniform_grid(steps), eta=eta, generator=g
    )
    return {k: round(v, 3) for k, v in strict_scores(to_uint8(x), y).items()}


def track(model, posterior: EmpiricalPosterior, n: int, cfg: float, steps: int, out: str | None) -> None:
    from tinydit.eval.shape_fit import fit_shapes
    from tinydit.flow.samplers import euler

    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 4
    rows, shots = [], []

    def velocity(x: torch.Tensor, t: float) -> torch.Tensor:
        v, _ = guided_velocity(model, x, torch.full((n,), t), y, cfg)
        x0_model = x - t * v
        x0_emp, ess = posterior(x, t, y)
        row = {"t": round(t, 3), "ess": round(ess, 1)}
        for name, x0 in (("model", x0_model), ("empirical", x0_emp)):
            fit = fit_shapes(to_uint8(x0.clamp(-1, 1)))
            ok = fit.passes(y)
            row[name] = round(float(ok.mean()), 3)
            row[name + "_cross"] = round(float(ok[y.numpy() == 3].mean()), 3)
        row["dist_cross"] = round((x0_model - x0_emp)[y == 3].pow(2).mean().item(), 4)
        rows.append(row)
        print(json.dumps(row), flush=True)
        shots.append((x0_model[y == 3][:6], x0_emp[y == 3][:6]))
        return v

    x = euler(velocity, torch.randn(n, 3, 32, 32, generator=g), uniform_grid(steps))
    final = strict_scores(to_uint8(x), y)
    print(json.dumps({"final": {k: round(v, 3) for k, v in final.items()}}), flush=True)
    if out:
        from torchvision.utils import save_image

        pick = list(range(0, len(shots), max(1, len(shots) // 8)))
        tiles = [torch.cat([shots[i][0], shots[i][1]], 0) for i in pick]  # per knot: 6 model, 6 empirical
        grid = torch.stack(tiles, 1).flatten(0, 1)  # rows: samples (model then empirical), columns: knots
        save_image((grid.clamp(-1, 1) + 1) / 2, out, nrow=len(pick), padding=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("losses", "hybrid", "track", "denoise", "keep"))
    p.add_argument("checkpoint")
    p.add_argument("--n", type=int, default=None, help="images (losses: 512 held-out; hybrid: 200 samples)")
    p.add_argument("--t", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95])
    p.add_argument("--switch", type=float, nargs="+", default=[0.8, 0.7], help="hybrid: the empirical x0 above")
    p.add_argument("--cfg", type=float, nargs="+", default=[1.0], help="hybrid: the model's guidance below")
    p.add_argument("--eta", type=float, nargs="+", default=[0.0], help="hybrid: 1 DDPM's noise, 0 Euler")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument(
        "--out",
        default=None,
        help="track: a PNG of the crosses' x0, the model's above the empirical; keep: ten crosses at the "
        "first --t, clean, noised, Euler and ancestral",
    )
    p.add_argument("--train-images", action="store_true", help="keep: start from training images, not held-out ones")
    args = p.parse_args()
    model, state = api.load_model(args.checkpoint)
    if args.what == "denoise":
        denoise(model, list(state.data.classes), args.n or 400, args.t)
        return
    if args.what == "keep":
        keep(model, list(state.data.classes), args.n or 400, args.t, args.steps, args.out, args.train_images)
        return
    train = ShapesDataset(n=20000)
    posterior = EmpiricalPosterior(from_uint8(train.images).float(), train.labels)
    if args.what == "losses":
        losses(model, posterior, args.n or 512, args.t)
        return
    if args.what == "track":
        for cfg in args.cfg:
            track(model, posterior, args.n or 200, cfg, args.steps, args.out)
        return
    for switch in args.switch:
        for cfg in args.cfg:
            for eta in args.eta:
                row = hybrid(model, posterior, args.n or 200, switch, cfg, eta, args.steps)
                print(json.dumps({"switch": switch, "cfg": cfg, "eta": eta, **row}), flush=True)


if __name__ == "__main__":
    main()
