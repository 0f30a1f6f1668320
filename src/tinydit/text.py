"""Text, with no downloads: a word-level tokenizer built from the training captions, and a small
transformer text encoder trained jointly with the generator.

    caption "a red circle on a blue background"
      --Tokenizer.encode-->  ids (N, L): BOS, word ids, then PAD (0) up to L = BOS + longest training caption
      --TextEncoder-->       ctx (N, L, D) one vector per token, pooled (N, D) the mean over non-padding tokens

Every encoded caption starts with BOS, so even the empty caption (BOS, then padding: the unconditional
input of classifier-free guidance) has one token to attend to; a row of padding only would make the
masked softmax a division by zero (NaN).

The tokenizer is plain data (a word list and L) and is stored in the checkpoint beside the model
config; the encoder is part of the model and of its state dict. Shape letters: N captions, L tokens
per caption, D width (``tinydit`` package docstring).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

from tinydit.errors import TinyDiTError
from tinydit.model import Attention, make_mlp

__all__ = ["PAD", "BOS", "UNK", "SPECIALS", "CLASS_TEMPLATE", "words", "Tokenizer", "TextEncoder", "empty_like",
           "class_captions", "parse_phrases", "holds_phrase"]  # fmt: skip

PAD, BOS, UNK = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<unk>")  # ids 0, 1, 2; words follow from id 3
CLASS_TEMPLATE = "a photo of a {}"  # captions for data sets that only have class names (CIFAR-10, Fashion-MNIST)

# A word: letters and digits, with inner hyphens or apostrophes kept ("t-shirt", "ankle-boot", "it's").
_WORD = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*")


def words(caption: str) -> list[str]:
    """The lower-cased words of a caption, punctuation dropped: "A red, RED circle!" -> [a, red, red, circle]."""
    return _WORD.findall(caption.lower())


def class_captions(labels: Sequence[int], classes: Sequence[str], template: str = CLASS_TEMPLATE) -> list[str]:
    """One caption per label from a template: "a photo of a sneaker"."""
    return [template.format(classes[int(i)]) for i in labels]


def parse_phrases(spec: str) -> tuple[str, ...]:
    """Comma-separated phrases as their words: "Red triangle, blue circle" -> ("red triangle", "blue circle");
    "" and "none" -> ()."""
    if spec.strip().lower() in ("", "none"):
        return ()
    phrases = [" ".join(words(part)) for part in spec.split(",")]
    if not all(phrases):
        raise TinyDiTError(f"an empty phrase in {spec!r}: give comma-separated phrases like 'red triangle,blue circle'")
    return tuple(dict.fromkeys(phrases))


def holds_phrase(caption: str, phrases: Sequence[str]) -> bool:
    """Whether the caption's words hold one of the phrases' words in a row: "red triangle" is in "a red
    triangle on a blue background", not in "a red square on a triangle"."""
    padded = f" {' '.join(words(caption))} "
    return any(f" {p} " in padded for p in phrases)


def empty_like(ids: torch.Tensor) -> torch.Tensor:
    """The empty caption in the layout of ids (N, L): BOS, then padding. Guidance's unconditional input."""
    empty = torch.zeros_like(ids)  # (N, L) of PAD
    empty[:, 0] = BOS
    return empty


@dataclass(frozen=True)
class Tokenizer:
    """Word-level tokenizer: lower-case words, punctuation stripped, one id per known word.

    ``vocab`` holds the words (ids 3, 4, ...; 0-2 are PAD, BOS, UNK), ``max_len`` is L, the ids per
    caption including BOS. Unknown words become UNK with a warning naming them; words beyond L - 1
    are dropped with a warning.
    """

    vocab: tuple[str, ...]  # the known words, sorted; word vocab[i] has id i + len(SPECIALS)
    max_len: int  # L: BOS plus the longest training caption, in words

    def __post_init__(self):
        if self.max_len < 1:
            raise TinyDiTError(f"Tokenizer.max_len must be >= 1 (room for BOS), got {self.max_len}")
        bad = [w for w in self.vocab if words(w) != [w]]
        if bad or len(set(self.vocab)) != len(self.vocab):
            raise TinyDiTError(f"a tokenizer vocabulary holds distinct lower-case words, got {bad or 'duplicates'}")

    @classmethod
    def from_captions(cls, captions: Sequence[str]) -> Tokenizer:
        """The vocabulary and L of a set of training captions (every word they use; L = 1 + the most words)."""
        split = [words(c) for c in captions]
        vocab = sorted({w for ws in split for w in ws})
        if not vocab:
            raise TinyDiTError("the training captions hold no words; give the images captions to train on text")
        return cls(tuple(vocab), 1 + max(len(ws) for ws in split))

    @cached_property
    def ids(self) -> dict[str, int]:
        return {w: i + len(SPECIALS) for i, w in enumerate(self.vocab)}

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self.vocab)

    def encode(self, captions: Sequence[str], warn: bool = True) -> torch.Tensor:
        """captions (N strings) -> ids (N, L) int64: BOS, the words' ids (UNK if unknown), PAD up to L."""
        if isinstance(captions, str):
            captions = [captions]
        rows, unknown, long = [], {}, []
        for caption in captions:
            ws = words(caption)
            for w in ws:
                if w not in self.ids:
                    unknown.setdefault(w, caption)
            if len(ws) > self.max_len - 1:
                long.append(caption)
            row = [BOS] + [self.ids.get(w, UNK) for w in ws[: self.max_len - 1]]
            rows.append(row + [PAD] * (self.max_len - len(row)))
        out = torch.tensor(rows, dtype=torch.long).reshape(len(rows), self.max_len)  # (N, L)
        if warn and unknown:
            where = "; ".join(f"{w!r} in {c!r}" for w, c in list(unknown.items())[:5])
            warnings.warn(f"unknown word{'s' if len(unknown) > 1 else ''} {where}{' ...' if len(unknown) > 5 else ''}:"
                          " not in this model's vocabulary (built from its training captions), read as <unk>",
                          stacklevel=2)  # fmt: skip
        if warn and long:
            warnings.warn(f"{len(long)} caption(s) longer than this model's {self.max_len - 1} words, e.g. "
                          f"{long[0]!r}: the words beyond are dropped", stacklevel=2)  # fmt: skip
        return out

    def decode(self, ids: torch.Tensor) -> list[str]:
        """ids (N, L) -> N captions: the words, lower-case, single-spaced; unknown ones as <unk>."""
        names = (*SPECIALS, *self.vocab)
        return [" ".join(names[i] for i in row if i not in (PAD, BOS)) for row in ids.tolist()]

    def to_dict(self) -> dict:
        """Plain lists and ints, for checkpoints read with ``weights_only=True``."""
        return {"vocab": list(self.vocab), "max_len": self.max_len}

    @classmethod
    def from_dict(cls, d: dict) -> Tokenizer:
        return cls(tuple(d["vocab"]), int(d["max_len"]))


class TextLayer(nn.Module):
    """A pre-norm transformer layer over the caption's tokens, padding masked out of the keys."""

    def __init__(self, dim: int, n_heads: int, mlp: str, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, n_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = make_mlp(mlp, dim, mlp_ratio)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """h (N, L, D), mask (N, 1, 1, L) bool, True = may attend -> (N, L, D)"""
        h = h + self.attn(self.norm1(h), attn_mask=mask)
        return h + self.mlp(self.norm2(h))


class TextEncoder(nn.Module):
    """Token ids -> per-token features and a pooled vector: learned token embeddings and 1-D positions,
    ``depth`` pre-norm transformer layers with the padding masked, a final LayerNorm.

    forward(ids): ids (N, L) int64, PAD = 0 and BOS first (``Tokenizer.encode``)
        -> ctx (N, L, D), pooled (N, D) the mean of ctx over non-padding tokens, keep (N, L) bool
    Padding changes nothing: its tokens are masked out of every key and out of the mean.
    """

    def __init__(self, vocab_size: int, max_len: int, dim: int, depth: int, n_heads: int, mlp: str = "gelu",
                 mlp_ratio: float = 4.0):  # fmt: skip
        super().__init__()
        self.max_len = max_len
        self.tok_embed = nn.Embedding(vocab_size, dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, max_len, dim))  # learned 1-D positions (BERT, GPT-2)
        self.layers = nn.ModuleList(TextLayer(dim, n_heads, mlp, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """ids (N, L) -> ctx (N, L, D), pooled (N, D), keep (N, L)"""
        if ids.dim() != 2 or ids.shape[1] > self.max_len:
            raise TinyDiTError(f"caption ids must be (N, L) with L <= {self.max_len} (Tokenizer.encode), "
                               f"got shape {tuple(ids.shape)}")  # fmt: skip
        keep = ids != PAD  # (N, L): BOS is never padding, so no row is all False
        mask = keep[:, None, None, :]  # (N, 1, 1, L): broadcast over heads and queries
        h = self.tok_embed(ids) + self.pos_embed[:, : ids.shape[1]]  # (N, L, D)
        for layer in self.layers:
            h = layer(h, mask)
        ctx = self.norm(h)  # (N, L, D)
        weight = keep.unsqueeze(-1).to(ctx.dtype)  # (N, L, 1)
        pooled = (ctx * weight).sum(1) / weight.sum(1)  # (N, D): mean over the caption's real tokens
        return ctx, pooled, keep
