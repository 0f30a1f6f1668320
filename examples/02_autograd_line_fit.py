"""Series post 3: autograd. Fit a line y = w x + b with nothing but tensors and backward().

python examples/02_autograd_line_fit.py --steps 300
"""

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(256, generator=gen) * 2 - 1  # (256,) inputs in [-1, 1]
    y = 3.0 * x - 0.5 + 0.05 * torch.randn(256, generator=gen)  # the line we hope to recover, plus noise

    w = torch.zeros((), requires_grad=True)  # tensors autograd will track
    b = torch.zeros((), requires_grad=True)
    for step in range(args.steps):
        loss = ((w * x + b - y) ** 2).mean()  # builds a graph: mul -> add -> sub -> pow -> mean
        loss.backward()  # fills w.grad and b.grad with d loss / d w and d loss / d b
        with torch.no_grad():  # the update itself must not be recorded
            w -= args.lr * w.grad
            b -= args.lr * b.grad
        w.grad = None  # gradients accumulate unless cleared
        b.grad = None
        if step % 100 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}  w {w.item():+.3f}  b {b.item():+.3f}")
    print(f"fitted y = {w.item():.3f} x {b.item():+.3f}   (true: y = 3.000 x -0.500)")
    if abs(w.item() - 3.0) > 0.05 or abs(b.item() + 0.5) > 0.05:
        raise SystemExit("did not converge: try more --steps")


if __name__ == "__main__":
    main()
