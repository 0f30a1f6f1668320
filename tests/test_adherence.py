import torch

from tinydit.data.shapes import COLORS, SHAPES, render_shape
from tinydit.eval.adherence import confusion_table, score, shape_confusion


def _render(attrs: list[dict]) -> torch.Tensor:
    """uint8 (N, 3, 32, 32): each attribute dict drawn large in the centre."""
    return torch.stack(
        [torch.from_numpy(render_shape(a["shape"], a["color"], a["background"], 16, 16, 16)) for a in attrs]
    )


def test_rendered_prompts_score_one_and_a_wrong_shape_scores_zero_on_shape_only():
    attrs = [{"shape": s, "color": "red", "background": "blue"} for s in SHAPES]
    images = _render(attrs)
    perfect = score(images, attrs, holdout=("red circle",))
    assert perfect["all"] == {"n": 4, "shape": 1.0, "color": 1.0, "background": 1.0, "all": 1.0}
    assert perfect["held_out"]["n"] == 1 and perfect["seen"]["n"] == 3
    # Every image is asked to be the next shape: colours still right, shapes all wrong.
    shifted = [{**a, "shape": SHAPES[(i + 1) % len(SHAPES)]} for i, a in enumerate(attrs)]
    wrong = score(images, shifted)["all"]
    assert (wrong["shape"], wrong["color"], wrong["background"], wrong["all"]) == (0.0, 1.0, 1.0, 0.0)


def test_shape_confusion_counts_how_each_prompted_shape_reads_back():
    attrs = [{"shape": s, "color": "yellow", "background": "blue"} for s in SHAPES]
    blank = torch.tensor(COLORS["blue"], dtype=torch.uint8).view(1, 3, 1, 1).expand(1, 3, 32, 32)  # no foreground
    images = torch.cat([_render(attrs), _render(attrs[:1]), blank])
    asked = [*attrs, {**attrs[0], "shape": "square"}, {**attrs[0], "shape": "cross"}]
    table = shape_confusion(images, asked)
    assert table["circle"] == {"circle": 1, "square": 0, "triangle": 0, "cross": 0, "none": 0}
    # the last circle was asked to be a square
    assert table["square"] == {"circle": 1, "square": 1, "triangle": 0, "cross": 0, "none": 0}
    assert table["cross"]["none"] == 1 and table["cross"]["cross"] == 1
    assert sum(sum(row.values()) for row in table.values()) == len(asked)
    md = confusion_table(table).splitlines()
    assert md[0].startswith("| prompted / read as | circle") and len(md) == 2 + len(SHAPES)
