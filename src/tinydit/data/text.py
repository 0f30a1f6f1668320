"""Captions and the word-level tokenizer, built from the training captions with no downloads.

    caption "a red circle on a blue background"
      --Tokenizer.encode-->  ids (N, L): BOS, word ids, then PAD (0) up to L = BOS + longest training caption

The tokenizer is plain data (a word list and L), stored in the checkpoint beside the model config
(``tokenizer_of``); the text encoder that reads the ids is part of the model
(``tinydit.models.text_encoder``). The id conventions both follow are in ``tinydit.tokens``. Shape
letters: N captions, L tokens per caption (``tinydit`` package docstring).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from tinydit.errors import TinyDiTError
from tinydit.tokens import BOS, PAD, SPECIALS, UNK, empty_like, holds_phrase, parse_phrases, words

__all__ = [
    "PAD",
    "BOS",
    "UNK",
    "SPECIALS",
    "CLASS_TEMPLATE",
    "words",
    "Tokenizer",
    "tokenizer_of",
    "empty_like",
    "class_captions",
    "parse_phrases",
    "holds_phrase",
]

CLASS_TEMPLATE = "a photo of a {}"  # captions for data sets that only have class names (CIFAR-10, Fashion-MNIST)


def class_captions(labels: Sequence[int], classes: Sequence[str], template: str = CLASS_TEMPLATE) -> list[str]:
    """One caption per label from a template: "a photo of a sneaker"."""
    return [template.format(classes[int(i)]) for i in labels]


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
            warnings.warn(
                f"unknown word{'s' if len(unknown) > 1 else ''} {where}{' ...' if len(unknown) > 5 else ''}:"
                " not in this model's vocabulary (built from its training captions), read as <unk>",
                stacklevel=2,
            )
        if warn and long:
            warnings.warn(
                f"{len(long)} caption(s) longer than this model's {self.max_len - 1} words, e.g. "
                f"{long[0]!r}: the words beyond are dropped",
                stacklevel=2,
            )
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


def tokenizer_of(checkpoint) -> Tokenizer | None:
    """The tokenizer a text model's ``tinydit.checkpoints.checkpoint.Checkpoint`` stores, or None for a class model."""
    return Tokenizer.from_dict(checkpoint.tokenizer) if checkpoint.tokenizer is not None else None
