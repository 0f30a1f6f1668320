"""Series post 5: nn.Module, a training loop with AdamW, and a checkpoint you can resume from.

Trains a small MLP to tell the four shapes apart, saves a checkpoint half way, resumes from it, and
checks the resumed run ends with exactly the weights of an uninterrupted one.

    python examples/04_training_loop_checkpoint.py --steps 200 --out examples_out
"""

import argparse
from pathlib import Path

import torch
from torch import nn

from tinydit.data.shapes import ShapesDataset
from tinydit.files import torch_save


class Classifier(nn.Module):
    """(N, 3, 32, 32) images -> (N, 4) class scores, with a transformer-style feed-forward block."""

    def __init__(self, n_classes: int = 4, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),  # (N, 3*32*32)
            nn.Linear(3 * 32 * 32, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def train(model, opt, data, labels, start: int, stop: int, batch: int = 64) -> float:
    loss = torch.zeros(())
    for step in range(start, stop):
        gen = torch.Generator().manual_seed(step)  # the batch of step s depends only on s: exact resume
        idx = torch.randint(0, len(data), (batch,), generator=gen)
        loss = nn.functional.cross_entropy(model(data[idx]), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default="examples_out")
    args = parser.parse_args()
    out = Path(args.out)
    ds, test = ShapesDataset(n=2000), ShapesDataset(n=500, train=False)
    data, labels = ds.images.float() / 127.5 - 1, ds.labels

    def fresh():
        torch.manual_seed(0)
        model = Classifier()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    straight, opt = fresh()
    train(straight, opt, data, labels, 0, args.steps)

    model, opt = fresh()
    half = args.steps // 2
    train(model, opt, data, labels, 0, half)
    out.mkdir(parents=True, exist_ok=True)
    # Written to a temporary file and renamed over the old one: a save cut short never leaves half a file.
    torch_save(out / "classifier.pt", {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": half})
    print("saved", out / "classifier.pt", "at step", half)

    state = torch.load(out / "classifier.pt", weights_only=True)  # tensors and plain values only: no code runs
    model, opt = fresh()
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    loss = train(model, opt, data, labels, state["step"], args.steps)

    pairs = zip(model.state_dict().values(), straight.state_dict().values(), strict=True)
    same = all(torch.equal(a, b) for a, b in pairs)
    with torch.no_grad():
        acc = (model(test.images.float() / 127.5 - 1).argmax(1) == test.labels).float().mean().item()
    print(f"final loss {loss:.3f} | held-out accuracy {acc:.1%} | resumed == uninterrupted: {same}")
    if not same:
        raise SystemExit("resumed weights differ from the uninterrupted run")


if __name__ == "__main__":
    main()
