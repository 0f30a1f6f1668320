"""Prompt adherence on ``shapes``: does a text-to-image model draw what its prompt says?

Images are generated for prompts built from shape attributes ("a red circle on a blue background") and
read back from their pixels with the shapes reader (``tinydit.data.shapes.read_shape``). The scores are
accuracies per attribute (``shape``, ``color``, ``background``) and for all three at once (``all``),
reported separately for prompts the model has seen combinations of and for prompts holding a
combination that was held out of training (``TrainConfig.holdout``, e.g. every "red triangle"): how
well the model composes words it only saw apart (compositional generalisation).

The prompt lists are fixed: every shape x colour x background combination (4 x 6 x 5 = 120 on render
version 2), ordered so that every 24 consecutive prompts hold each (colour, shape) pair once. On real renders the reader
gets all three attributes right at least 99% of the time, and 95% with pixel noise
(tests/test_shapes.py), so the scores measure the model far more than the reader.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tinydit.data.shapes import COLORS, GRID_PROMPTS, SHAPES, caption, read_shape
from tinydit.data.text import holds_phrase
from tinydit.flow.generate import generate
from tinydit.flow.settings import SamplingSettings
from tinydit.images import to_uint8

__all__ = [
    "GRID_PROMPTS",
    "ATTRIBUTES",
    "shape_accuracy",
    "GROUPS",
    "combinations",
    "prompts_for",
    "score",
    "flatten",
    "markdown_table",
    "measure",
    "shape_confusion",
    "confusion_table",
]

ATTRIBUTES = ("shape", "color", "background")
GROUPS = ("seen", "held_out", "all")


def combinations(holdout: Sequence[str] = (), which: str = "all") -> list[dict]:
    """The 120 attribute dicts {shape, color, background} in a fixed order (shape fastest, then colour,
    then the background's offset from the colour), filtered to ``which``: all | seen | held_out."""
    colors = list(COLORS)
    out = []
    for k in range(len(SHAPES) * len(colors) * (len(colors) - 1)):
        c = (k // len(SHAPES)) % len(colors)
        offset = 1 + k // (len(SHAPES) * len(colors))  # 1..5: the background is never the shape's colour
        attrs = {"shape": SHAPES[k % len(SHAPES)], "color": colors[c], "background": colors[(c + offset) % len(colors)]}
        held = holds_phrase(caption(attrs), holdout)
        if which == "all" or (which == "held_out") == held:
            out.append(attrs)
    if which not in GROUPS:
        raise ValueError(f"which must be one of {', '.join(GROUPS)}, got {which!r}")
    return out


def prompts_for(n: int, holdout: Sequence[str] = (), which: str = "all") -> list[dict]:
    """n attribute dicts cycling through ``combinations(holdout, which)``."""
    combos = combinations(holdout, which)
    if not combos:
        raise ValueError(f"no {which} combinations with holdout {list(holdout)}")
    return [combos[i % len(combos)] for i in range(n)]


def shape_accuracy(images: torch.Tensor, labels: torch.Tensor) -> float:
    """The share of images (N, 3, H, W) whose shape, read back from their pixels, is the one their label
    (N,) asked for: a class-conditional shapes model's accuracy (chance is 1 / 4)."""
    u8 = to_uint8(images) if images.is_floating_point() else images
    hits = [read_shape(img)["shape"] == SHAPES[int(y)] for img, y in zip(u8, labels, strict=True)]
    return sum(hits) / max(1, len(hits))


def score(images: torch.Tensor, attrs: Sequence[dict], holdout: Sequence[str] = ()) -> dict[str, dict]:
    """Accuracies of images (N, 3, H, W) (float in [-1, 1] or uint8) against their prompts' attributes.

    Returns {group: {"n", "shape", "color", "background", "all"}} for the groups seen, held_out (if any
    prompt is held out) and all. Float images are quantised to uint8 first, as a saved PNG would be.
    """
    if len(images) != len(attrs):
        raise ValueError(f"{len(images)} images for {len(attrs)} prompts; give one prompt per image")
    u8 = to_uint8(images) if images.is_floating_point() else images
    hits = {a: [] for a in ATTRIBUTES}
    held = []
    for img, want in zip(u8, attrs, strict=True):
        got = read_shape(img)
        for a in ATTRIBUTES:
            hits[a].append(got[a] == want[a])
        held.append(holds_phrase(caption(want), holdout))
    correct = torch.tensor([hits[a] for a in ATTRIBUTES])  # (3, N) bool
    correct = torch.cat([correct, correct.all(0, keepdim=True)])  # (4, N): the attributes, then all at once
    is_held = torch.tensor(held, dtype=torch.bool)  # (N,)
    out = {}
    for group, sel in (("seen", ~is_held), ("held_out", is_held), ("all", torch.ones_like(is_held))):
        if sel.any():
            acc = correct[:, sel].double().mean(1).tolist()  # (4,)
            out[group] = {"n": int(sel.sum()), **dict(zip((*ATTRIBUTES, "all"), acc, strict=True))}
    return out


def flatten(result: dict[str, dict], prefix: str = "adherence") -> dict[str, float | int]:
    """{"seen": {"shape": 0.9, ...}} -> {"adherence_shape_seen": 0.9, ...}, for metrics.json."""
    return {f"{prefix}_{key}_{group}": value for group, scores in result.items() for key, value in scores.items()}


def markdown_table(results: dict[str, dict[str, dict]]) -> str:
    """One row per (model, group): n and the four accuracies, from ``score`` results keyed by model name."""
    lines = ["| model | prompts | n | shape | color | background | all three |", "|---|---|---|---|---|---|---|"]
    for name, result in results.items():
        for group in GROUPS:
            if group in result:
                r = result[group]
                lines.append(
                    f"| {name} | {group.replace('_', '-')} | {r['n']} | "
                    + " | ".join(f"{r[k]:.3f}" for k in (*ATTRIBUTES, "all"))
                    + " |"
                )
    return "\n".join(lines)


@torch.no_grad()
def measure(
    model: torch.nn.Module,
    tokenizer,
    holdout: Sequence[str],
    n_seen: int,
    n_held_out: int,
    settings: SamplingSettings,
    seed: int = 0,
    with_confusion: bool = False,
) -> dict[str, dict] | tuple[dict[str, dict], dict[str, dict[str, int]]]:
    """Generate n_seen images for seen prompts and n_held_out for held-out ones (if any are held out),
    drawn with ``settings``, and ``score`` them. The noise is fixed by ``seed``, so two models are compared
    on the same noise. With ``with_confusion`` also return ``shape_confusion`` of the same images."""

    attrs = prompts_for(n_seen, holdout, "seen")
    if holdout and n_held_out:
        attrs += prompts_for(n_held_out, holdout, "held_out")
    device = next(model.parameters()).device
    ids = tokenizer.encode([caption(a) for a in attrs]).to(device)  # (N, L)
    images = generate(model, ids, settings, seed).x
    result = score(images, attrs, holdout)
    if with_confusion:
        return result, shape_confusion(images, attrs)
    return result


def shape_confusion(images: torch.Tensor, attrs: Sequence[dict]) -> dict[str, dict[str, int]]:
    """How the pixel reader reads each prompted shape: {prompted: {read: count}} over images (N, 3, H, W).

    "none" counts images in which it finds no foreground. A model that draws round blobs for every
    prompt scores well on circles and badly on the rest; the per-attribute accuracy hides that.
    """
    u8 = to_uint8(images) if images.is_floating_point() else images
    table = {want: {got: 0 for got in (*SHAPES, "none")} for want in SHAPES}
    for img, want in zip(u8, attrs, strict=True):
        table[want["shape"]][read_shape(img)["shape"] or "none"] += 1
    return table


def confusion_table(table: dict[str, dict[str, int]]) -> str:
    """``shape_confusion`` as a markdown table: one row per prompted shape, one column per reading."""
    cols = list(next(iter(table.values())))
    lines = ["| prompted / read as | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    lines += [f"| {want} | " + " | ".join(str(row[c]) for c in cols) + " |" for want, row in table.items()]
    return "\n".join(lines)
