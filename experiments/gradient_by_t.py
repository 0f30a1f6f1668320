"""Where along the path a model's training gradient comes from: the norm of the flow loss's gradient for a
batch of held-out images all at one time t, for several t.

    python scripts/gradient_by_t.py CHECKPOINT [--t 0.03 0.07 0.15 0.3 0.5 0.7 0.9 0.97] [--batch 64]

A training batch draws its times at random, so its gradient is the mean of these per-time gradients weighted
by how often each time is drawn; a time whose gradient is a hundred times another's steers the optimizer
even when it is drawn rarely. The checkpoint's raw weights (not the EMA: these are the weights the optimizer
moves), in train mode, on the data set's held-out images with their labels; prints one JSON line per t
(the loss and the gradient's norm, each the mean over ``--repeats`` batches of fresh noise).
"""

from __future__ import annotations

import argparse
import json

import torch

from tinydit import api
from tinydit.data import load_dataset
from tinydit.flow.path import flow_loss
from tinydit.runtime import autocast


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--t", type=float, nargs="+", default=[0.03, 0.07, 0.15, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.97])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=4, help="batches per t, each with its own images and noise")
    p.add_argument("--precision", default="bf16", help="the autocast of the forward pass, as the run trained")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    model, state = api.load_model(args.checkpoint, ema=False)
    model.train()
    data = load_dataset(state.data.name, train=False, limit=max(512, args.batch))
    gen = torch.Generator().manual_seed(args.seed)
    params = [w for w in model.parameters() if w.requires_grad]
    for t0 in args.t:
        losses, norms = [], []
        for _ in range(args.repeats):
            idx = torch.randperm(len(data), generator=gen)[: args.batch]
            images, labels = zip(*(data[int(i)] for i in idx), strict=True)  # each image read once
            x0, y = torch.stack(images), torch.tensor(labels)  # (N, C, H, W), (N,)
            noise = torch.randn(x0.shape, generator=gen)
            model.zero_grad(set_to_none=True)
            with autocast(torch.device("cpu"), args.precision):
                loss = flow_loss(model, x0, y, torch.full((args.batch,), t0), noise)
            loss.backward()
            norms.append(torch.sqrt(sum(w.grad.float().pow(2).sum() for w in params if w.grad is not None)).item())
            losses.append(loss.item())
        row = {"t": t0, "loss": sum(losses) / len(losses), "grad_norm": sum(norms) / len(norms)}
        print(json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)


if __name__ == "__main__":
    main()
