"""The caption conventions shared by the tokenizer (``tinydit.data.text``) and the text encoder
(``tinydit.models.text_encoder``): token ids, words and phrases.

    PAD = 0, BOS = 1, UNK = 2; word ids follow from 3
    an encoded caption (L ids): BOS, its words' ids, then PAD up to L
    the empty caption (BOS, then PAD) is the unconditional input of classifier-free guidance

Every caption starts with BOS, so even the empty one has one token to attend to: a row of padding only
would make the masked softmax a division by zero (NaN).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from tinydit.errors import TinyDiTError

__all__ = ["PAD", "BOS", "UNK", "SPECIALS", "words", "parse_phrases", "holds_phrase", "empty_like"]

PAD, BOS, UNK = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<unk>")  # ids 0, 1, 2; words follow from id 3


# A word: letters and digits, with inner hyphens or apostrophes kept ("t-shirt", "ankle-boot", "it's").
_WORD = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*")


def words(caption: str) -> list[str]:
    """The lower-cased words of a caption, punctuation dropped: "A red, RED circle!" -> [a, red, red, circle]."""
    return _WORD.findall(caption.lower())


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
