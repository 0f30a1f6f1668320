"""Scores that need no reference images, so a model can be checked anywhere, in seconds: what a shipped
reference model's config.json records (``scripts/make_reference.py``) and ``tests/test_reference.py``
measures again.

* shapes, class models: the strict judge's pass rate and colours (``tinydit.eval.shape_fit``)
* shapes, text models: all-attribute prompt adherence on seen prompts (``tinydit.eval.adherence``) and the
  strict judge on the prompted shape
* Fashion-MNIST: how often its feature CNN reads the asked class
"""

from __future__ import annotations

import torch

from tinydit.checkpoints.checkpoint import load_model
from tinydit.data.registry import record_of
from tinydit.errors import TinyDiTError
from tinydit.eval.features import extract, load_feature_net
from tinydit.eval.sampling import EvalTarget, sample_for_eval
from tinydit.eval.shape_fit import strict_scores
from tinydit.images import to_uint8

__all__ = ["check_scores", "check_model"]


def check_scores(images_uint8: torch.Tensor, labels: torch.Tensor, data: str) -> dict[str, float]:
    """Scores of class-conditional samples (N, 3, H, W) uint8 with their labels (N,) of data set ``data``."""
    record = record_of(data)
    if record.judged:
        scores = strict_scores(images_uint8, labels)
        return {"shape_strict": scores["strict"], "shape_colours": scores["colours"]}
    if record.feature_net is None:
        raise TinyDiTError(f"{data} has no offline feature network to check samples with")
    net, _ = load_feature_net(record.feature_net)
    _, predictions = extract(net, images_uint8)
    return {f"class_consistency_{record.feature_net}": (predictions == labels.cpu()).double().mean().item()}


def check_model(checkpoint, n: int, seed: int = 0, steps: int | None = None) -> dict[str, float]:
    """``n`` evaluation samples (fp32, noise from ``seed``) of a checkpoint or pretrained folder with its
    recorded sampler settings (``steps`` of them, if given: a cheaper check), scored as above. Text models
    are asked every shape x colour x background prompt in turn, as ``tinydit eval`` asks them."""
    model, state = load_model(checkpoint)
    target = EvalTarget.of_checkpoint(state)
    x, labels, info = sample_for_eval(model, target, n, state.sampling_settings().with_flags(steps=steps), seed)
    if target.tokenizer is None:
        return check_scores(to_uint8(x), labels, target.data)
    if not record_of(target.data).judged:
        raise TinyDiTError("a text model can be checked on shapes only: its prompts are read back from the pixels")
    return {"adherence_all_seen": info["adherence_all_seen"], "shape_strict": info["shape_strict"]}
