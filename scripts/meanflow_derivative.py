"""How much of a mean-flow model's training target is its own derivative in t.

The mean-flow target is u_tgt = v - (t - r) du/dt with du/dt = v . grad_z u + du/dt|_z (tinydit.flow.meanflow).
For a checkpoint trained with ``--objective meanflow``, on a batch of its training images at a few intervals,
this prints the sizes (mean squares) of the path's velocity v, of the whole derivative, of its part along z
only, the model's error against the target, and how far the average velocity u(z, r, t) has moved from the
instantaneous one u(z, t, t) (0: the model has not learned intervals, and one step draws a class mean).

    python scripts/meanflow_derivative.py --checkpoint RUN/checkpoint.pt
"""

from __future__ import annotations

import argparse

import torch

from tinydit.checkpoints.checkpoint import load_model
from tinydit.data import load_dataset
from tinydit.flow.meanflow import jvp_du_dt

INTERVALS = ((0.0, 1.0), (0.4, 0.8), (0.45, 0.5))  # (r, t): one step from noise, a middle, a short one


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--n", type=int, default=64, help="training images")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    model, state = load_model(args.checkpoint)
    if not model.config.shortcut:
        raise SystemExit("this checkpoint's model does not take an interval: train it with --objective meanflow")
    ds = load_dataset(state.data.name, train=True, limit=args.n)
    x0 = torch.stack([ds[i][0] for i in range(len(ds))])  # (n, C, H, W)
    y = torch.tensor([int(ds[i][1]) for i in range(len(ds))])
    g = torch.Generator().manual_seed(args.seed)
    noise = torch.randn(x0.shape, generator=g)
    v = noise - x0
    print(f"{args.checkpoint}: step {state.step}, time_scale {model.config.time_scale:g}, {len(ds)} images")
    print("| r | t | v | du/dt | du/dt along z only | error against the target | u(z, r, t) - u(z, t, t) |")
    print("|---|---|---|---|---|---|---|")
    ms = lambda a: a.pow(2).mean().item()  # noqa: E731
    for r_, t_ in INTERVALS:
        t, r = torch.full((len(ds),), t_), torch.full((len(ds),), r_)
        z = (1 - t_) * x0 + t_ * noise
        with torch.no_grad():
            u, du_dt = jvp_du_dt(model, z, r, t, y, v)
            _, along_z = jvp_du_dt(model, z, r, t, y, v, along_t=False)
            target = v - (t_ - r_) * du_dt
            instantaneous = model(z, t, y, torch.zeros_like(t))
        print(
            f"| {r_:g} | {t_:g} | {ms(v):.3f} | {ms(du_dt):.3f} | {ms(along_z):.3f} | {ms(u - target):.3f} | "
            f"{ms(u - instantaneous):.4f} |"
        )


if __name__ == "__main__":
    main()
