"""The model types' presets and the values their architecture switches take: the one table of each, kept
beside the models (as DiT's ``DiT_models`` and gpt-fast's ``transformer_configs``). Plain data: it imports
nothing, so the configs, the registry and the training run's resolve step all read the same names."""

from __future__ import annotations

__all__ = [
    "NORMS",
    "MLPS",
    "POSITIONS",
    "PREDICTIONS",
    "CONDS",
    "MODEL_CONDS",
    "DIT_PRESETS",
    "MMDIT_PRESETS",
    "MODEL_PRESETS",
    "DEFAULT_PRESETS",
]

# The architecture switches of DiTConfig (tinydit.models.dit) and the values each takes.
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
POSITIONS = ("sincos", "rope")
PREDICTIONS = ("v", "x")
CONDS = ("class", "text")  # class: y is a label (N,) | text: y is caption token ids (N, L)

# The model types, the conditionings each takes (the default first) and their presets. The classes behind
# the names are registered in tinydit.models.registry (a test checks that the two agree).
MODEL_CONDS: dict[str, tuple[str, ...]] = {"dit": CONDS, "mmdit": ("text",)}

# Presets fix the trunk (width, depth, heads, patch). Names carry the real parameter count, measured
# for 32x32 RGB with 10 classes (tests/test_model.py checks each name against count_params).
# fmt: off
DIT_PRESETS: dict[str, dict] = {
    # pred="auto": the network predicts the clean image (x, JiT) on RGB data and the velocity (v) on
    # grayscale. A 3-channel patch holds more noise than a narrow token can carry, which x-prediction
    # avoids; 1-channel patches have no such bottleneck, and there x did worse. Old checkpoints (no field)
    # load as v.
    "dit-0.2m": dict(dim=64, depth=2, n_heads=2, patch_size=4, pred="auto"),  # smoke tests: seconds per run
    # dit-1.9m two blocks shallower: in a few CPU minutes the shapes' layout gains more from the extra
    # steps than from the depth (two blocks fewer again drew worse shapes).
    "dit-1.3m": dict(dim=128, depth=4, n_heads=4, patch_size=4, mlp="swiglu", pred="auto"),
    # dit-1.3m with pixel-level convolutions around the trunk (a 3x3 stem before the patches, a 3x3 head
    # after them, so neighbouring patches agree on an edge), U-ViT's long skips and QK-norm: the shapes
    # quick start's (its data set's record, tinydit.data.registry).
    "dit-1.4m": dict(dim=128, depth=4, n_heads=4, patch_size=4, mlp="swiglu", qk_norm=True, stem="conv", head="conv",
                     skips=True, pred="auto"),
    # The CPU preset: minutes per run. SwiGLU is its one switch that won the equal-time ablation on
    # Fashion-MNIST; RMSNorm, QK-norm and RoPE each scored worse there and stay off.
    "dit-1.9m": dict(dim=128, depth=6, n_heads=4, patch_size=4, mlp="swiglu", pred="auto"),
    "dit-9.8m": dict(dim=256, depth=8, n_heads=4, patch_size=4, pred="auto"),  # a longer CPU run, or a GPU
    "dit-32m": dict(dim=384, depth=12, n_heads=6, patch_size=2, pred="auto"),  # GPU: 256 tokens per 32x32 image
}
# fmt: on

# Names carry the real parameter count, measured for 32x32 RGB shapes with its caption tokenizer (16 ids,
# L = 8; tests/test_mmdit.py checks each). A joint block holds the weights of two DiT blocks, so
# mmdit-2.3m (2 joint + 2 single-stream blocks) has exactly the parameters of dit-1.9m with the same
# text encoder (2,318,384 each): the pair benchmarks/text_to_image.py compares. mmdit-2.1m is SD3's
# all-joint trunk, one block shorter.
# fmt: off
MMDIT_PRESETS: dict[str, dict] = {
    "mmdit-0.2m": dict(dim=64, depth=1, n_heads=2, patch_size=4, text_depth=1, pred="auto"),  # smoke tests
    "mmdit-2.1m": dict(dim=128, depth=3, n_heads=4, patch_size=4, mlp="swiglu", text_depth=2, pred="auto"),
    "mmdit-2.3m": dict(
        dim=128, depth=2, single_blocks=2, n_heads=4, patch_size=4, mlp="swiglu", text_depth=2, pred="auto"
    ),
}
# fmt: on

MODEL_PRESETS: dict[str, dict[str, dict]] = {"dit": DIT_PRESETS, "mmdit": MMDIT_PRESETS}
DEFAULT_PRESETS: dict[str, str] = {"dit": "dit-1.9m", "mmdit": "mmdit-2.3m"}
