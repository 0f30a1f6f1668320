"""Samples drawn for an evaluation: what a model is asked to draw (class-balanced labels, or prompts for a text
model), drawn with given sampler settings, and scored by ``tinydit.eval.evaluate`` (``score_model``, what
training's evaluations call)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tinydit.checkpoints.checkpoint import Checkpoint, load_model
from tinydit.data.registry import canonical_name, record_of
from tinydit.data.shapes import SHAPES, caption
from tinydit.data.text import Tokenizer, class_captions, parse_phrases, tokenizer_of
from tinydit.distributed import SINGLE, World
from tinydit.errors import TinyDiTError
from tinydit.eval.adherence import flatten, prompts_for, score, shape_accuracy
from tinydit.eval.evaluate import DEFAULT_CACHE, EvalSpec, evaluate, spec_for
from tinydit.eval.protocol import describe_protocol, protocol_of
from tinydit.eval.shape_fit import strict_scores
from tinydit.flow.distill import warn_if_untrained_settings
from tinydit.flow.generate import class_cycle, generate
from tinydit.flow.settings import SamplingSettings

__all__ = ["EvalTarget", "eval_conditions", "generate_for_eval", "sample_for_eval", "score_model"]


@dataclass(frozen=True)
class EvalTarget:
    """What a model's evaluation samples are asked to be: its data set's canonical name and classes, and for a
    text model its tokenizer and the phrases its training held out. A checkpoint gives one
    (``of_checkpoint``); a run in training gives its own, from its data."""

    data: str
    classes: tuple[str, ...]
    tokenizer: Tokenizer | None = None
    holdout: tuple[str, ...] = ()

    @classmethod
    def of_checkpoint(cls, ckpt: Checkpoint) -> EvalTarget:
        holdout = parse_phrases(ckpt.holdout or "")
        return cls(ckpt.data.name, ckpt.data.classes, tokenizer_of(ckpt), tuple(holdout))


def eval_conditions(target: EvalTarget, n: int) -> tuple[torch.Tensor, torch.Tensor, list[dict] | None]:
    """What n evaluation samples of ``target`` are conditioned on: y (labels (n,), or caption ids (n, L) for a
    text model), each sample's class (n,), and for a shapes text model its prompt's attributes (for prompt
    adherence; else None).

    Text prompts, by the data set's caption rule (``DatasetRecord.captions``): for shapes, whose samples are
    read back from their pixels, every shape x colour x background combination in turn
    (``tinydit.eval.adherence``), held-out ones included; for class captions (CIFAR-10, Fashion-MNIST) the
    class template ("a photo of a sneaker"); for an image folder the folder's name. So the samples stay
    class-balanced, as for class models.
    """

    classes, data, tokenizer = list(target.classes), target.data, target.tokenizer
    if tokenizer is None:
        labels = class_cycle(n, len(classes))
        return labels, labels, None
    attrs, record = None, record_of(data)
    if record.judged:
        attrs = prompts_for(n)
        captions = [caption(a) for a in attrs]
        labels = torch.tensor([SHAPES.index(a["shape"]) for a in attrs])
    else:
        labels = class_cycle(n, len(classes))
        if record.captions == "class":
            captions = class_captions(labels.tolist(), classes)
        else:  # an image folder: the caption of images without a sidecar file (tinydit.data.datasets.folder_caption)
            captions = [Path(classes[i]).name or Path(data).name for i in labels.tolist()]
    return tokenizer.encode(captions, warn=False), labels, attrs


def generate_for_eval(
    checkpoint: str | Path | dict,
    n: int,
    settings: SamplingSettings,
    seed: int,
    device: torch.device,
    data: str | None,
    *,
    progress: bool = False,
    world: World = SINGLE,
) -> tuple[torch.Tensor, torch.Tensor, EvalSpec, list[str], dict]:
    """n class-balanced samples from a checkpoint: images, labels, how its data set is evaluated (the
    reference ``data`` names, which must be the one it was trained on), classes, sampler info.

    Generation runs in fp32 on every device (unlike ``tinydit sample``'s bf16 default where that is
    faster), so scores compare across machines.

    The info records the sampler ``settings`` in full, defaults included. For a text model trained on
    shapes it also holds the prompt-adherence scores of the samples (``adherence_*``,
    ``tinydit.eval.adherence``).
    """

    if n < 1:
        raise TinyDiTError(f"`n` must be >= 1, got {n}")
    model, state = load_model(checkpoint, map_location=device)
    warn_if_untrained_settings(state.objective == "distill", settings)
    trained_on = state.data.name  # canonical, as the run resolved it
    if data is not None and canonical_name(data) != trained_on:
        raise TinyDiTError(f"{state.source} was trained on {trained_on}, not {data}; drop `data`")
    spec = spec_for(trained_on, state.data.img_size)  # an unsupported data set fails before any sampling
    target = EvalTarget.of_checkpoint(state)
    x, labels, info = sample_for_eval(model, target, n, settings, seed, progress=progress, world=world)
    sampler = {**settings.filled().to_json(), "seed": seed}
    return x, labels, spec, list(state.data.classes), {**info, "sampler": sampler, "precision": "fp32"}


def sample_for_eval(
    model,
    target: EvalTarget,
    n: int,
    settings: SamplingSettings,
    seed: int,
    *,
    progress: bool = False,
    world: World = SINGLE,
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """n class-balanced samples of ``model``, asked to be ``target``: images, labels and info (model
    evaluations per image, seconds; for a shapes text model the prompt-adherence scores, ``adherence_*``)."""
    y, labels, attrs = eval_conditions(target, n)
    started = time.perf_counter()
    res = generate(model, y, settings, seed, progress=progress, world=world)
    info = {"nfe_per_image": res.nfe, "generation_seconds": time.perf_counter() - started}
    if attrs is not None:
        holdout = list(target.holdout)
        info.update(flatten(score(res.x, attrs, holdout)), adherence_holdout=",".join(holdout) or "none")
    if record_of(target.data).judged:  # class or text: is the shape its label or prompt asked for drawn?
        # The strict judge (a clean shape of the asked kind fits; tinydit.eval.shape_fit) is the quality
        # figure; read_shape's lenient reading stays beside it as a diagnostic.
        info.update({f"shape_{k}": v for k, v in strict_scores(res.x, labels).items()})
        if attrs is None:  # a text model's lenient reading is its adherence_shape_*
            info["shape_accuracy"] = shape_accuracy(res.x, labels)
    return res.x, labels, info


def score_model(
    model,
    target: EvalTarget,
    n: int,
    settings: SamplingSettings,
    seed: int = 0,
    root: str | Path = "data",
    cache_dir: str | Path | None = DEFAULT_CACHE,
    *,
    progress: bool = False,
    precision: str | None = None,
) -> dict:
    """``sample_for_eval``'s samples scored with the offline metrics against the test split: one flat dict
    of numbers (what evaluation during training logs), and under ``protocol`` the line that says what they
    were measured under (``tinydit.eval.protocol``; ``precision``: what the caller samples in)."""
    x, labels, info = sample_for_eval(model, target, n, settings, seed, progress=progress)
    spec = spec_for(target.data, x.shape[-1])  # an image folder's reference at the size it trained at
    # best.pt is chosen by the headline network or the strict judge; the independent network reads a final
    # checkpoint (tinydit eval) and would only add its cost and five more curves to every evaluation here
    metrics = evaluate(x.float(), labels, spec, root=root, cache_dir=cache_dir, independent=False)
    measured = {**metrics, **info, "sampler": settings.filled().to_json(), "precision": precision}
    numbers = {k: v for k, v in {**metrics, **info}.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {**numbers, "protocol": describe_protocol(protocol_of(measured))}
