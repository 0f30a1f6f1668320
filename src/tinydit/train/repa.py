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

from tinydit.errors import TinyDiTError
from tinydit.eval.features import load_feature_net

__all__ = ["REPA_ENCODERS", "REPA_DEPTH", "Alignment", "check_repa", "repa_encoder"]

# data set -> the shipped encoder whose features the tokens are aligned to
# (scripts/train_feature_net.py --name, recorded in assets/feature_nets.json)
REPA_ENCODERS = {"shapes": "shapes_repa", "fashion-mnist": "fmnist_repa"}
# the tokens after this many blocks are aligned: early, so that the later blocks build on what they learn
REPA_DEPTH = 2
PROJECTOR_WIDTH = 256  # the projector's hidden width (REPA's is 2048 for 1152-wide tokens)


def repa_encoder(repa: float, data: str) -> str | None:
    """The shipped encoder a run on ``data`` aligns to, or None where it does not align (``repa`` 0)."""
    return REPA_ENCODERS[data] if repa else None


def check_repa(repa: float, data: str, few_step: str, depth: int) -> None:
    """Refuse an alignment the run cannot do, naming what would make it work."""
    if repa == 0:
        return
    if data not in REPA_ENCODERS:
        raise TinyDiTError(
            f"`repa` needs a shipped encoder for the data set; there is one for {', '.join(REPA_ENCODERS)}, "
            f"not for {data}: set `repa` 0"
        )
    if few_step != "none":
        raise TinyDiTError("`repa` works with `few_step` none; set `repa` 0 for this run")
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
        model.blocks[REPA_DEPTH - 1].register_forward_hook(self._keep)

    def _keep(self, module: nn.Module, args, output: torch.Tensor | tuple) -> None:
        # A DiT block returns the image tokens; an MMDiT joint block returns (image tokens, caption tokens).
        self._tokens = output[0] if isinstance(output, tuple) else output  # (N, T, D)

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

    def loss(self, x0: torch.Tensor) -> torch.Tensor:
        """-cos(projector(tokens), features), the mean over tokens and images: in [-1, 1], lower is better."""
        if self._tokens is None:
            raise TinyDiTError("the alignment loss needs the model's forward pass on the same images first")
        z = self.projector(self._tokens).float()  # (N, T, F)
        self._tokens = None
        return -F.cosine_similarity(z, self.target(x0), dim=-1).mean()
