"""A sample grid with its rows or columns labelled, for the guide: what ``tinydit sample`` draws, with the
class of each column (class models) or the prompt of each row (text models) written beside it.

    python scripts/labelled_grid.py --checkpoint shapes --per-class 8 --out docs/quickstart_shapes.png
    python scripts/labelled_grid.py --checkpoint shapes-text --per-class 6 --out docs/t2i_shapes_text.png \
        --prompt "a red circle on a blue background" --prompt "a yellow cross on a magenta background"
    python scripts/labelled_grid.py --checkpoint runs/a --title "five minutes" --checkpoint shapes \
        --title "4,500 steps" --out side_by_side.png

``--checkpoint`` is a checkpoint, a run directory, a pretrained folder or the name of a shipped reference
model (``tinydit sample --pretrained``); the sampler settings are the ones it records, as ``tinydit sample``
uses them with no flags (the seed is ``--seed``). Several class models (``--checkpoint`` again, each with
its ``--title``) are drawn side by side, one panel each, from the same seed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tinydit import api  # noqa: E402
from tinydit.checkpoints.checkpoint import load_checkpoint  # noqa: E402
from tinydit.checkpoints.pretrained import reference_folder, reference_models  # noqa: E402
from tinydit.data.text import tokenizer_of  # noqa: E402
from tinydit.images import to_uint8  # noqa: E402


def sample_panel(checkpoint: str, per_class: int, prompts: list[str] | None, seed: int) -> dict:
    """What ``tinydit sample`` draws for one checkpoint, grouped: one group per class or prompt."""
    source = reference_folder(checkpoint) if checkpoint in reference_models() else Path(checkpoint)
    state = load_checkpoint(source)  # what kind of model, and its classes: the model is built by api.sample
    text = tokenizer_of(state) is not None
    if text:
        res = api.sample(source, per_class, prompts=prompts, seed=seed)
    else:
        res = api.sample(source, per_class * len(state.data.classes), seed=seed)
    images, labels = to_uint8(res.x).permute(0, 2, 3, 1).numpy(), res.labels.tolist()  # (N, H, W, C)
    groups = [[i for i, y in enumerate(labels) if y == k] for k in range(len(res.names))]
    groups = [g for g in groups if g]
    names = [res.names[labels[g[0]]] for g in groups]
    return dict(text=text, images=images, groups=groups, names=names, note=res.settings.note)


def draw_panel(target, panel: dict, per_class: int, title: str | None) -> None:
    """Class models: one column per class; text models: one row per prompt."""
    text, images, groups = panel["text"], panel["images"], panel["groups"]
    rows, cols = (len(groups), per_class) if text else (per_class, len(groups))
    axes = target.subplots(rows, cols, squeeze=False)
    for g, members in enumerate(groups):
        for j, i in enumerate(members):
            ax = axes[g, j] if text else axes[j, g]
            ax.imshow(images[i].squeeze(), cmap="gray" if images.shape[-1] == 1 else None, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
        if text:
            axes[g, 0].set_ylabel(panel["names"][g], rotation=0, ha="right", va="center", fontsize=8)
        else:
            axes[0, g].set_title(panel["names"][g], fontsize=9)
    if title:
        target.suptitle(title, fontsize=9)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = "checkpoint, run directory, pretrained folder or reference name; again for another panel (class models)"
    p.add_argument("--checkpoint", action="append", required=True, help=what)
    p.add_argument("--per-class", type=int, default=8, help="images per class (a column) or per prompt (a row)")
    p.add_argument("--prompt", action="append", help="text models: a row's prompt (default: the run's grid prompts)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--title", action="append", default=[], help="a line above the grid; one per --checkpoint")
    p.add_argument("--out", required=True, help="the figure (.png)")
    args = p.parse_args()
    if args.title and len(args.title) != len(args.checkpoint):
        p.error(f"{len(args.checkpoint)} --checkpoint and {len(args.title)} --title: give one title per checkpoint")
    panels = [sample_panel(c, args.per_class, args.prompt, args.seed) for c in args.checkpoint]
    if len(panels) > 1 and any(panel["text"] for panel in panels):
        p.error("side-by-side panels are for class models; draw a text model on its own")
    text, n = panels[0]["text"], len(panels[0]["groups"])
    rows, cols = (n, args.per_class) if text else (args.per_class, n)
    size = (len(panels) * (cols * 0.9 + (3.2 if text else 0.3)), rows * 0.9 + 0.8)
    fig = plt.figure(figsize=size, layout="constrained")
    titles = args.title or [None] * len(panels)
    for target, panel, title in zip(fig.subfigures(1, len(panels), squeeze=False)[0], panels, titles, strict=True):
        draw_panel(target, panel, args.per_class, title)
    fig.savefig(args.out, dpi=110)
    for checkpoint, panel in zip(args.checkpoint, panels, strict=True):
        print(f"{args.out}: {checkpoint}: {panel['note']}")


if __name__ == "__main__":
    main()
