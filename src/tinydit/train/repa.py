"""Representation alignment (REPA; Yu et al. 2024, "Representation Alignment for Generation: Training
Diffusion Transformers Is Easier Than You Think"): an extra training loss that pulls the DiT's tokens
after an early block, through a small MLP (the projector), towards the features a frozen, pretrained
encoder computes from the clean image. The DiT then need not discover a representation of the image from
its own noisy inputs alone; its early blocks learn one by imitation.

    loss = flow_loss + repa * (-cos(projector(h_depth(x_t)), encoder(x0)))   averaged over tokens and images

The encoder is a shipped network of the evaluation's architecture (``tinydit.eval.features.FeatureNet``)
trained with another seed than the one that scores the samples, so that training does not optimise its
own judge, and taught besides the class, at every cell of its feature map, where the image's shape has its
centre and how large it is (``scripts/train_feature_net.py --geometry``): a token aligned to it knows which
part of the shape it must draw. Its last feature map before the global average, pooled to the token grid,
is the target. The projector is training state (saved in the checkpoint, continued with the run), not part
of the model: a sampled or exported model is the DiT alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tinydit.data.registry import DATASETS
from tinydit.errors import TinyDiTError
from tinydit.eval.features import load_feature_net
from tinydit.flow.objectives import OBJECTIVES, Objective

__all__ = [
    "REPA_ENCODERS",
    "REPA_DEPTH",
    "Alignment",
    "TargetCache",
    "check_repa",
    "repa_encoder",
]

# data set -> the shipped encoder whose features the tokens are aligned to, as the data sets' records name
# them (scripts/train_feature_net.py --name, recorded in assets/feature_nets.json)
REPA_ENCODERS = {r.name: r.repa_encoder for r in DATASETS.values() if r.repa_encoder}
# the tokens after this many blocks are aligned: early, so that the later blocks build on what they learn
REPA_DEPTH = 2
PROJECTOR_WIDTH = 256  # the projector's hidden width (REPA's is 2048 for 1152-wide tokens)
# Kept targets are computed in batches of exactly this many images, so that one image's target does not
# depend on which images shared its batch (a convolution library may pick another kernel for another batch
# size): a continued run, or another rank, computes the same bits. Small, because each image is kept both
# ways round and flipped at random: for epochs after the first, a training batch still misses a few
# targets, and a batch padded to the training batch's size would cost as much as computing them all.
TARGET_BATCH = 16
# A set whose targets would take more than this (bfloat16, both ways round) computes them every step instead.
MAX_KEPT_BYTES = 2 * 2**30


def repa_encoder(repa: float, data: str) -> str | None:
    """The shipped encoder a run on ``data`` aligns to, or None where it does not align (``repa`` 0)."""
    return REPA_ENCODERS[data] if repa else None


def check_repa(repa: float, data: str, objective: Objective, depth: int) -> None:
    """Refuse an alignment the run cannot do, naming what would make it work."""
    if repa == 0:
        return
    if data not in REPA_ENCODERS:
        raise TinyDiTError(
            f"`repa` needs a shipped encoder for the data set; there is one for {', '.join(REPA_ENCODERS)}, "
            f"not for {data}: set `repa` 0"
        )
    if not objective.aligned:  # a shortcut model and a distilled student refuse it
        aligned = [o.name for o in OBJECTIVES.values() if o.aligned]
        raise TinyDiTError(f"`repa` works with `objective` {' or '.join(aligned)}; set `repa` 0 for this run")
    check_depth(depth)


def check_depth(depth: int) -> None:
    """Refuse a model with fewer than ``REPA_DEPTH`` blocks: it has no tokens to align."""
    if depth < REPA_DEPTH:
        raise TinyDiTError(
            f"`repa` aligns the tokens after block {REPA_DEPTH}; the model has {depth}: "
            "set `repa` 0 or take a deeper preset"
        )


class Alignment(nn.Module):
    """The projector, and the loss that aligns ``model``'s tokens after ``REPA_DEPTH`` blocks to ``encoder``'s
    features of the clean images.

    Call ``loss(x0)`` right after the model's forward pass on the noisy versions of the same images x0
    (N, C, H, W): a forward hook keeps the tokens (N, T, D) of that pass.
    """

    def __init__(self, model: nn.Module, encoder: str):
        super().__init__()
        check_depth(model.config.depth)
        net, _ = load_feature_net(encoder)
        body = list(net.body)
        pool = next(i for i, m in enumerate(body) if isinstance(m, nn.AdaptiveAvgPool2d))
        # Not a submodule: frozen, shipped with the package, and not part of the run's state.
        self._encoder = (nn.Sequential(*body[:pool]).requires_grad_(False).eval(),)
        self.grid = model.config.img_size // model.config.patch_size  # tokens per side
        self.projector = nn.Sequential(
            nn.Linear(model.config.dim, PROJECTOR_WIDTH),
            nn.SiLU(),
            nn.Linear(PROJECTOR_WIDTH, PROJECTOR_WIDTH),
            nn.SiLU(),
            nn.Linear(PROJECTOR_WIDTH, net.feature_dim),
        )
        self._tokens: torch.Tensor | None = None
        self._kept: TargetCache | None = None
        model.blocks[REPA_DEPTH - 1].register_forward_hook(self._keep)

    def keep_targets(self, n_images: int) -> bool:
        """Keep the target of each of ``n_images`` training images (both ways round) once computed, where
        they fit in ``MAX_KEPT_BYTES``; returns whether they do. ``loss`` then needs each image's key."""
        tokens, features = self.grid * self.grid, self.projector[-1].out_features
        if 2 * n_images * tokens * features * 2 > MAX_KEPT_BYTES:
            self._kept = None
        else:
            self._kept = TargetCache(n_images, tokens, features)
        return self._kept is not None

    def _keep(self, module: nn.Module, args, output: torch.Tensor | tuple) -> None:
        # A DiT block returns the image tokens; an MMDiT joint block returns (image tokens, caption tokens).
        tokens = output[0] if isinstance(output, tuple) else output  # (N, T, D), a class token after them
        self._tokens = tokens[:, : self.grid * self.grid]  # the image tokens: the grid, row-major

    @torch.no_grad()
    def target(self, x0: torch.Tensor) -> torch.Tensor:
        """The encoder's features of clean images x0 (N, C, H, W) on the token grid: float32 (N, T, F).

        The encoder runs in the caller's precision (a bf16 run's autocast): its features are a direction
        to align to, which bf16 keeps (tests/test_repa.py compares them with float32's), and in float32
        the encoder would cost more than the projector's forward and backward together."""
        encoder = self._encoder[0].to(x0.device)
        feats = encoder(x0).float()  # (N, F, h, w)
        feats = F.adaptive_avg_pool2d(feats, self.grid)  # (N, F, grid, grid), row-major as the tokens
        return feats.flatten(2).transpose(1, 2)  # (N, T, F)

    def loss(self, x0: torch.Tensor, keys: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """-cos(projector(tokens), features), the mean over tokens and images: in [-1, 1], lower is better.

        ``keys``: (index (N,) int64 in the training set, mirrored (N,) bool) of each image of x0, where the
        run keeps its targets (``keep_targets``)."""
        if self._tokens is None:
            raise TinyDiTError("the alignment loss needs the model's forward pass on the same images first")
        z = self.projector(self._tokens).float()  # (N, T, F)
        self._tokens = None
        if self._kept is not None and keys is not None:
            target = self._kept.get(x0, *keys, self.target)
        else:
            target = self.target(x0)
        return -F.cosine_similarity(z, target, dim=-1).mean()


class TargetCache:
    """The alignment targets (T, F) of ``n`` training images, each way round, kept in bfloat16 (a direction,
    which bf16 keeps) once computed: up to 4 n T F bytes, on a CPU taken as targets arrive (untouched pages
    stay free), on CUDA at the first batch; each rank of a DDP run keeps its own."""

    def __init__(self, n: int, tokens: int, features: int):
        self.n, self.shape = n, (tokens, features)
        self.store: torch.Tensor | None = None  # (2 n, T, F) bfloat16 on the first images' device
        self.filled = torch.zeros(2 * n, dtype=torch.bool)  # on the CPU: which rows hold a target

    def get(self, x0: torch.Tensor, index: torch.Tensor, mirrored: torch.Tensor, compute) -> torch.Tensor:
        """The targets of images x0 (N, C, H, W), training-set ``index`` (N,) flipped where ``mirrored`` (N,):
        float32 (N, T, F). The missing ones come from ``compute(images)`` in batches of ``TARGET_BATCH``."""
        rows = index.cpu() + self.n * mirrored.cpu().long()  # (N,) row of each image's target
        if self.store is None:
            self.store = torch.empty(2 * self.n, *self.shape, dtype=torch.bfloat16, device=x0.device)
        missing = (~self.filled[rows]).nonzero().flatten()  # (M,) positions in the batch
        if missing.numel():
            # An image twice in one batch is computed once, at its first position: (U,) positions.
            new, which = torch.unique(rows[missing], return_inverse=True)
            pos = torch.full((len(new),), len(rows)).scatter_reduce(0, which, missing, reduce="amin")
            for chunk in pos.split(TARGET_BATCH):
                pad = chunk.new_full((TARGET_BATCH - len(chunk),), int(chunk[0]))  # the batch's size is fixed
                feats = compute(x0[torch.cat([chunk, pad]).to(x0.device)])[: len(chunk)]  # (len, T, F)
                self.store[rows[chunk].to(x0.device)] = feats.to(torch.bfloat16)
                self.filled[rows[chunk]] = True
        return self.store[rows.to(x0.device)].float()  # (N, T, F)
