"""Seeded, batched generation: the noise of every image drawn up front, so that image i does not depend
on the batch size; and what a sampling command draws each image of (``sample_conditions``: class labels,
or caption ids of its prompts)."""

from __future__ import annotations

import torch
from torch import nn

from tinydit.data.text import Tokenizer
from tinydit.distributed import SINGLE, World
from tinydit.errors import TinyDiTError
from tinydit.flow.samplers import OnStep, SampleResult, sample
from tinydit.flow.settings import SamplingSettings
from tinydit.progress import Progress

__all__ = ["class_cycle", "generate", "sample_conditions", "resolve_labels", "resolve_prompts"]


def class_cycle(n: int, n_classes: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """Labels 0, 1, ..., n_classes-1, 0, 1, ... so any n is as class-balanced as it can be: (n,)."""
    return torch.arange(n, device=device) % n_classes


@torch.no_grad()
def generate(
    model: nn.Module,
    y: torch.Tensor,
    settings: SamplingSettings,
    seed: int = 0,
    batch_size: int = 256,
    *,
    progress: bool = False,
    world: World = SINGLE,
    on_step: OnStep | None = None,
) -> SampleResult:
    """Samples for labels y (N,) or caption ids (N, L), in batches, as ``settings`` say (checked when they
    were built). ``on_step(i, t, x, x0)`` (``tinydit.flow.solvers``) sees every step of the first batch:
    the first ``batch_size`` images (of this process's share).

    The noise for all N images is drawn first from one generator seeded with ``seed``, so with a
    fixed-step sampler image i does not depend on the batch size, and the same seed gives the same
    images on the same device. The ancestral sampler draws its fresh noise from the same generator,
    batch after batch, so its images depend on the batch size too. ``nfe`` is per image; dopri5 may take
    a different number in each batch, and then it is the average over all images.

    ``world`` (``tinydit.distributed``, under torchrun): every rank samples its contiguous share of the N
    images from the same up-front noise and all of them get all N back, so a fixed-step sampler's images
    are those of one process (the ancestral sampler's fresh noise is drawn per rank, so its are not).
    """
    if len(y) < 1:
        raise TinyDiTError("nothing to sample: ask for at least one image (n >= 1)")
    if batch_size < 1:
        raise TinyDiTError(f"`batch_size` must be >= 1, got {batch_size}")
    cfg = model.config
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    n = len(y)
    noise = torch.randn(n, cfg.in_channels, cfg.img_size, cfg.img_size, generator=gen)  # on the CPU
    mine = world.share(n)  # all N in one process
    noise, y = noise[mine], y[mine]
    if world.size > 1 and settings.sampler == "ancestral":  # its own fresh-noise stream per rank
        gen = torch.Generator().manual_seed(seed * 1_000_003 + world.rank + 1)
    out, evals = [], 0
    # a bar on a terminal, else a line now and then; under torchrun rank 0's share stands for all
    bar = Progress(len(y), "sample", unit="image", enabled=progress and world.main)
    for i in range(0, len(y), batch_size):
        x1, yb = noise[i : i + batch_size].to(device), y[i : i + batch_size].to(device)
        # gen: the ancestral sampler's fresh noise, one stream batch after batch
        res = sample(settings, model, x1, yb, generator=gen, on_step=on_step if i == 0 else None)
        out.append(res.x.cpu())
        evals += res.nfe * len(yb)
        bar.update(len(yb))
    bar.close()
    x = torch.cat(out) if out else noise[:0]
    if world.size > 1:
        x, evals = world.gather(x, n), int(world.sum(torch.tensor(evals)).item())
    nfe = evals // n if evals % n == 0 else evals / n
    return SampleResult(x, nfe)


def sample_conditions(
    model_name: str,
    classes_known: list[str],
    tokenizer: Tokenizer | None,
    grid_prompts: list[str],
    n: int | None,
    classes,
    prompts,
    unconditional: bool,
    nrow: int | None,
):
    """What ``sample`` draws each image of: (y, labels, names, nrow), for a model (called ``model_name`` in
    errors) trained on ``classes_known``, or on captions ``tokenizer`` reads with ``grid_prompts`` its run's
    grid prompts. Class models: labels (N,) of ``classes`` (default all, n = 64), a column each; text models:
    caption ids (P n, L) of ``prompts`` (default the grid prompts, n = 8 each), a row each;
    ``unconditional``: the null label or the empty caption."""
    names = list(classes_known)
    if tokenizer is None:
        if prompts:
            raise TinyDiTError(
                f"{model_name} is class-conditional (classes: {', '.join(names)}): use `classes`, not "
                "`prompts`; prompts need a text run (`model` mmdit or `cond` text)"
            )
        n = 64 if n is None else n
        if unconditional:  # the null label is n_classes: one class name per label (the checkpoint's reader checks)
            y = labels = torch.full_like(resolve_labels(None, names, n), len(names))  # n checked
            names = [*names, "unconditional"]
        else:
            y = labels = resolve_labels(classes, names, n)
        return y, labels, names, nrow or (len(names) if not (classes or unconditional) else min(8, n))
    if classes:
        raise TinyDiTError(f"{model_name} is a text-to-image model: use `prompts`, not `classes`")
    if not (unconditional or prompts or grid_prompts):
        raise TinyDiTError(f"{model_name} records no prompts to draw: pass `prompts`, one or more captions")
    names = [""] if unconditional else list(prompts or grid_prompts)
    n = 8 if n is None else n
    y, labels = resolve_prompts(names, tokenizer, n, allow_empty=unconditional)  # (P n, L), (P n,): a row each
    return y, labels, names, nrow or n


def resolve_labels(specs: list[str] | None, classes: list[str], n: int) -> torch.Tensor:
    """Labels (n,) for class names or ids given by a user, cycled to length n; all classes if none.

    ``specs`` items may be names ("sneaker") or ids ("7"); names match case-insensitively.
    """
    if n < 1:
        raise TinyDiTError(f"`n` must be >= 1, got {n}")
    if not specs:
        return class_cycle(n, len(classes))
    lookup = {name.lower(): i for i, name in enumerate(classes)}
    ids = []
    for spec in specs:
        for item in str(spec).split(","):
            item = item.strip()
            if not item:
                raise TinyDiTError(f"`classes` {spec!r} holds a blank name: give class names or ids, comma-separated")
            if item.isdigit() and int(item) < len(classes):
                ids.append(int(item))
            elif item.lower() in lookup:
                ids.append(lookup[item.lower()])
            else:
                raise TinyDiTError(
                    f"unknown class {item!r}: this model knows {', '.join(classes)} (or ids 0-{len(classes) - 1})"
                )
    return torch.tensor(ids, dtype=torch.long)[torch.arange(n) % len(ids)]


def resolve_prompts(
    prompts: list[str], tokenizer, n: int, allow_empty: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Caption ids (P n, L) for n images of each of P prompts, prompt after prompt, and each image's
    prompt index (P n,). Unknown words warn by name (``tinydit.data.text.Tokenizer.encode``)."""
    if n < 1:
        raise TinyDiTError(f"`n` must be >= 1, got {n}")
    if not prompts:
        raise TinyDiTError("no prompt given: pass `prompts`, one or more captions (one grid row each)")
    if not allow_empty and any(not p.strip() for p in prompts):
        raise TinyDiTError(
            "an empty prompt would sample with no caption at all; give a caption, or ask for "
            "unconditional samples with `unconditional`"
        )
    index = torch.arange(len(prompts)).repeat_interleave(n)  # (P n,): row p holds prompt p
    return tokenizer.encode(list(prompts))[index], index
