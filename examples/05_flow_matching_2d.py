"""Series post 8: flow matching on 2-D points, with the same loss and sampler TinyDiT uses for images.

The data are points on a ring of radius 1. A small MLP learns the velocity that carries Gaussian noise
(t = 1) to the ring (t = 0) along straight lines; Euler's method then walks fresh noise back.

    python examples/05_flow_matching_2d.py --steps 1500
"""

import argparse
from types import SimpleNamespace

import torch
from torch import nn

from tinydit.flow import flow_loss
from tinydit.flow.samplers import sample
from tinydit.flow.settings import SamplingSettings


class VelocityMLP(nn.Module):
    """v(x, t): (N, 2) points and (N,) times -> (N, 2) velocities; labels are ignored."""

    def __init__(self, hidden: int = 128):
        super().__init__()
        self.config = SimpleNamespace(n_classes=1)  # the sampler's contract: labels 0..n_classes
        self.net = nn.Sequential(
            nn.Linear(3, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 2)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return self.net(torch.cat([x, t.unsqueeze(1)], dim=1))


def ring(n: int, gen: torch.Generator) -> torch.Tensor:
    angle = torch.rand(n, generator=gen) * 2 * torch.pi
    return torch.stack([angle.cos(), angle.sin()], dim=1) + 0.03 * torch.randn(n, 2, generator=gen)  # (n, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = VelocityMLP()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for step in range(args.steps):
        x0 = ring(256, gen)
        loss = flow_loss(model, x0, None, torch.rand(256, generator=gen), torch.randn(256, 2, generator=gen))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 500 == 0:
            print(f"step {step:5d}  flow-matching loss {loss.item():.4f}")

    noise = torch.randn(2000, 2, generator=gen)
    res = sample(SamplingSettings("euler", steps=50, cfg_scale=1.0), model, noise, torch.zeros(2000, dtype=torch.long))
    radius = res.x.norm(dim=1)
    print(
        f"noise radius {noise.norm(dim=1).mean():.2f} -> sample radius {radius.mean():.3f} "
        f"(std {radius.std():.3f}) in {res.nfe} model evaluations; the data lie at radius 1"
    )
    if not 0.85 < radius.median().item() < 1.15:
        raise SystemExit("samples did not reach the ring: train longer (--steps)")


if __name__ == "__main__":
    main()
