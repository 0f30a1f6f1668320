"""The DiT's configuration (``DiTConfig``: everything needed to rebuild a DiT, stored in every checkpoint),
its presets and the architecture switches, apart from the model (``tinydit.models.dit``) as the Hugging
Face libraries keep ``configuration_*.py`` beside ``modeling_*.py``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from tinydit.errors import TinyDiTError
from tinydit.models.presets import CONDS, DEFAULT_PRESETS, MLPS, MODEL_PRESETS, NORMS, POSITIONS, PREDICTIONS
from tinydit.schema import build

__all__ = ["DiTConfig", "PRESETS", "DEFAULT_PRESET", "SWITCHES", "ORIGINAL_BLOCK", "CONDS", "PIXEL_MAPS", "get_preset"]

PIXEL_MAPS = {"stem": ("patch", "conv"), "head": ("linear", "conv")}


@dataclass(frozen=True)
class DiTConfig:
    """Everything needed to rebuild a DiT; stored in every checkpoint."""

    img_size: int = 32  # H = W of the images the model sees
    in_channels: int = 3  # C: 3 for RGB, 1 for grayscale
    patch_size: int = 4  # p: each p x p patch becomes one token, T = (img_size / p) ** 2
    dim: int = 256  # D: token width
    depth: int = 6  # number of DiT blocks
    n_heads: int = 4  # attention heads; dim must divide evenly
    mlp_ratio: float = 4.0  # MLP hidden width = mlp_ratio * dim
    n_classes: int = 10  # class labels 0..n_classes-1; id n_classes is the "null" label for guidance
    norm: str = "layernorm"  # block norms: layernorm | rmsnorm (both without affine: adaLN scales them)
    qk_norm: bool = False  # RMS-normalise q and k per head before the dot product
    mlp: str = "gelu"  # gelu (exact erf form) | swiglu (hidden width 2/3 of GELU's, same params)
    pos: str = "sincos"  # sincos: fixed 2-D sin-cos added to the tokens | rope: 2-D axial RoPE on q and k
    shortcut: bool = False  # also condition on the step size d, for few-step sampling (tinydit.flow.shortcut)
    # t and d reach the model as sinusoidal features of time_scale * t (DiT: 1000). A mean-flow model is
    # trained on its own derivative in t (tinydit.flow.meanflow), which the fastest feature multiplies.
    time_scale: float = 1000.0
    # A shortcut model's smallest trained step: a smaller d (d = 0 too) is embedded as this one, the level
    # its flow matching trained (tinydit.flow.shortcut); 0: every d as given
    finest_step: float = 0.0
    # What the network outputs: v (the velocity itself) | x (the clean image; v derived from it) | auto
    # (resolved at construction: x for RGB data, v for grayscale; see PRESETS).
    pred: str = "v"
    cond: str = "class"  # class: y is a label (N,) | text: y is caption token ids (N, L) (tinydit.data.text)
    vocab_size: int = 0  # text: the tokenizer's vocabulary, special tokens included (set from the data)
    text_len: int = 0  # text: L, token ids per caption: BOS + the longest training caption (set from the data)
    text_depth: int = 2  # text: transformer layers of the text encoder (width dim, n_heads heads, same MLP)
    # How pixels become tokens: patch (one p x p strided convolution, DiT) | conv (a 3x3 convolution to
    # `conv_channels` features at full resolution first, so a token also sees the pixels around its patch)
    stem: str = "patch"
    # How tokens become pixels: linear (each token's patch from one linear map, DiT) | conv (the linear map
    # writes `conv_channels` features per pixel and a 3x3 convolution mixes neighbouring patches, U-ViT)
    head: str = "linear"
    conv_channels: int = 16  # features per pixel of a conv stem or head
    # 3x3 convolutions in a conv stem and in a conv head, each pair with a SiLU between: more than one lets
    # the pixels do fine work that a coarser token grid (a larger patch) leaves to them (U-ViT, hourglass)
    conv_depth: int = 1
    # Long skips (U-ViT, Bao et al. 2023): the second half of the blocks also takes the output of the
    # mirror block in the first half, concatenated and projected back to dim, as a U-Net's decoder does
    skips: bool = False
    # How the class reaches the network besides adaLN's c (class models; both off: DiT). class_token: the
    # class's own embedding joins the image tokens as one more token, which every image token attends to
    # (DiT's in-context conditioning), so a token can ask what to draw where adaLN only scales it.
    # class_pixels: a per-class bias on the conv stem's and conv head's features, so the pixel-level maps,
    # which draw the edges a shape's kind is told by, know the class too.
    class_token: bool = False
    class_pixels: bool = False

    def __post_init__(self):
        for name in ("img_size", "in_channels", "patch_size", "dim", "depth", "n_heads", "n_classes"):
            if getattr(self, name) < 1:
                raise TinyDiTError(f"DiTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.img_size % self.patch_size:
            raise TinyDiTError(f"patch_size {self.patch_size} does not divide img_size {self.img_size}; pick a divisor")
        if self.dim % self.n_heads:
            raise TinyDiTError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.dim % 4:
            raise TinyDiTError(f"dim {self.dim} must be divisible by 4 for the 2-D sin-cos positions")
        if self.mlp_ratio <= 0:
            raise TinyDiTError(f"mlp_ratio must be > 0, got {self.mlp_ratio}")
        if not self.time_scale > 0:
            raise TinyDiTError(f"time_scale must be > 0, got {self.time_scale}")
        if not 0 <= self.finest_step <= 1:
            raise TinyDiTError(f"finest_step must be in [0, 1], got {self.finest_step}")
        if self.pred == "auto":  # frozen dataclass: set the resolved value once, here
            object.__setattr__(self, "pred", "x" if self.in_channels > 1 else "v")
        for name, allowed in (("norm", NORMS), ("mlp", MLPS), ("pos", POSITIONS), ("pred", PREDICTIONS)):
            if getattr(self, name) not in allowed:
                raise TinyDiTError(f"DiTConfig.{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        for name in ("stem", "head"):
            if getattr(self, name) not in PIXEL_MAPS[name]:
                raise TinyDiTError(
                    f"DiTConfig.{name} must be one of {', '.join(PIXEL_MAPS[name])}, got {getattr(self, name)!r}"
                )
        if self.conv_channels < 1:
            raise TinyDiTError(f"DiTConfig.conv_channels must be >= 1, got {self.conv_channels}")
        if self.conv_depth < 1:
            raise TinyDiTError(f"DiTConfig.conv_depth must be >= 1, got {self.conv_depth}")
        if self.pos == "rope" and self.head_dim % 4:
            raise TinyDiTError(f"2-D RoPE needs a head dim divisible by 4 (dim / n_heads), got {self.head_dim}")
        if (self.class_token or self.class_pixels) and self.cond != "class":
            raise TinyDiTError("class_token and class_pixels condition a class model; a text model takes neither")
        if self.class_pixels and "conv" not in (self.stem, self.head):
            raise TinyDiTError("class_pixels biases a conv stem's or conv head's features: set stem or head to conv")
        if self.cond not in CONDS:
            raise TinyDiTError(f"DiTConfig.cond must be one of {', '.join(CONDS)}, got {self.cond!r}")
        if self.cond == "text":
            if self.vocab_size < 4 or self.text_len < 1:
                raise TinyDiTError(
                    f"a text-conditioned model needs vocab_size >= 4 and text_len >= 1 (got {self.vocab_size} and "
                    f"{self.text_len}): take both from the tokenizer (Tokenizer.vocab_size, Tokenizer.max_len)"
                )
            if self.text_depth < 0:
                raise TinyDiTError(f"DiTConfig.text_depth must be >= 0, got {self.text_depth}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def grid_size(self) -> int:
        return self.img_size // self.patch_size

    @property
    def n_tokens(self) -> int:
        return self.grid_size**2

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, key: str = "model_config") -> DiTConfig:
        """A stored config (a checkpoint's ``key``), its types and values checked; errors name ``key`` and the field."""
        if isinstance(d, dict):
            unknown = set(d) - {f.name for f in fields(cls)}
            if unknown:
                raise TinyDiTError(f"unknown DiT config keys {sorted(map(str, unknown))}: written by a newer tinydit?")
        return build(cls, d, key)


PRESETS = MODEL_PRESETS["dit"]  # the table of every model type is tinydit.models.presets
DEFAULT_PRESET = DEFAULT_PRESETS["dit"]

# The architecture switches one at a time and all together, each spelled out in full so that it means
# the same on top of any preset (benchmarks/bench_train.py --switches, benchmarks/ablation.py, tests).
ORIGINAL_BLOCK = dict(norm="layernorm", qk_norm=False, mlp="gelu", pos="sincos", pred="v")  # DiT as published
SWITCHES: dict[str, dict] = {
    "baseline": ORIGINAL_BLOCK,
    "rmsnorm": {**ORIGINAL_BLOCK, "norm": "rmsnorm"},
    "qk_norm": {**ORIGINAL_BLOCK, "qk_norm": True},
    "swiglu": {**ORIGINAL_BLOCK, "mlp": "swiglu"},
    "rope": {**ORIGINAL_BLOCK, "pos": "rope"},
    "all four": dict(norm="rmsnorm", qk_norm=True, mlp="swiglu", pos="rope", pred="v"),
    "x_pred": {**ORIGINAL_BLOCK, "pred": "x"},  # the network outputs the clean image (JiT)
    "swiglu+x_pred": {**ORIGINAL_BLOCK, "mlp": "swiglu", "pred": "x"},  # dit-1.9m on RGB data
}


def get_preset(name: str, **data) -> DiTConfig:
    """The preset's config, completed with the data's ``img_size``, ``in_channels`` and ``n_classes``."""
    if name not in PRESETS:
        raise TinyDiTError(f"unknown preset {name!r}: use one of {', '.join(PRESETS)} (see `tinydit presets`)")
    return DiTConfig(**{**PRESETS[name], **data})  # in one go: pred="auto" is resolved for the data's channels
