"""A sample grid with its rows or columns labelled, for the guide: what ``tinydit sample`` draws, with the
class of each column (class models) or the prompt of each row (text models) written beside it.

    python scripts/labelled_grid.py --checkpoint shapes --per-class 8 --out docs/quickstart_shapes.png
    python scripts/labelled_grid.py --checkpoint shapes-text --per-class 6 --out docs/t2i_shapes_text.png \
        --prompt "a red circle on a blue background" --prompt "a yellow cross on a magenta background"

``--checkpoint`` is a checkpoint, a run directory, a pretrained folder or the name of a shipped reference
model (``tinydit sample --pretrained``); the sampler settings are the ones it records, as ``tinydit sample``
uses them with no flags (the seed is ``--seed``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tinydit import api  # noqa: E402
from tinydit.data.text import tokenizer_of  # noqa: E402
from tinydit.images import to_uint8  # noqa: E402
from tinydit.models.checkpoint import load_checkpoint  # noqa: E402
from tinydit.models.pretrained import reference_folder, reference_models  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="checkpoint, run directory, pretrained folder or reference name")
    p.add_argument("--per-class", type=int, default=8, help="images per class (a column) or per prompt (a row)")
    p.add_argument("--prompt", action="append", help="text models: a row's prompt (default: the run's grid prompts)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--title", default=None, help="a line above the grid")
    p.add_argument("--out", required=True, help="the figure (.png)")
    args = p.parse_args()
    source = reference_folder(args.checkpoint) if args.checkpoint in reference_models() else Path(args.checkpoint)
    state = load_checkpoint(source)  # what kind of model, and its classes: the model is built by api.sample
    text = tokenizer_of(state) is not None
    if text:
        res = api.sample(source, args.per_class, prompts=args.prompt, seed=args.seed)
    else:
        res = api.sample(source, args.per_class * len(state["data"]["classes"]), seed=args.seed)
    images, labels = to_uint8(res.x).permute(0, 2, 3, 1).numpy(), res.labels.tolist()  # (N, H, W, C)
    groups = [[i for i, y in enumerate(labels) if y == k] for k in range(len(res.names))]
    groups = [g for g in groups if g]
    # Class models: one column per class; text models: one row per prompt.
    rows, cols = (len(groups), args.per_class) if text else (args.per_class, len(groups))
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 0.9 + (3.2 if text else 0), rows * 0.9 + 0.6), squeeze=False)
    for g, members in enumerate(groups):
        for j, i in enumerate(members):
            ax = axes[g, j] if text else axes[j, g]
            ax.imshow(images[i].squeeze(), cmap="gray" if images.shape[-1] == 1 else None, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
        name = res.names[labels[members[0]]]
        if text:
            axes[g, 0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize=8)
        else:
            axes[0, g].set_title(name, fontsize=9)
    if args.title:
        fig.suptitle(args.title, fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"{args.out}: {res.note}")


if __name__ == "__main__":
    main()
