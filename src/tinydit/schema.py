"""Typed records read from files, checked once, where the file is read; and text arguments that must say something.

A record (a model config, a checkpoint's data record, a training config, a pretrained folder's config.json)
is a dataclass. ``build`` makes one from the dict a file holds: every value is checked against its field's
annotation first, then the dataclass checks ranges and consistency in its own ``__post_init__``. Either way
a wrong value is one ``TinyDiTError`` naming the key (``model_config.dim``), the value and what was
expected, instead of a TypeError deep inside the code that later uses it; ``reading`` adds the file.

Why the annotations and not a schema library (pydantic, jsonschema): the dataclasses already are the schema,
with a comment per field, and a second description of the same fields would drift from them. The rules
needed are few: a JSON list stands for a tuple, a JSON integer for a float, a bool is not a number, and a
number is finite (JSON readers take NaN and Infinity, which pass every range check written as a comparison).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import re
import types
import typing
from collections.abc import Iterator

from tinydit.errors import TinyDiTError

__all__ = ["build", "check_fields", "check_value", "expected", "reading", "check_text"]

_NONE = type(None)


def _parts(tp) -> tuple:
    """The members of a union annotation (``int | None`` -> (int, NoneType)), or the annotation alone."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def expected(tp) -> str:
    """What an annotation asks for, in words: "an integer or null", "a list of strings"."""
    words = [_expected_one(t) for t in _parts(tp) if t is not _NONE]
    text = " or ".join(words) if words else "null"
    return text + (" or null" if _NONE in _parts(tp) and words else "")


def _expected_one(tp) -> str:
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_plural(args[0])}"
        return f"a list of {len(args)} {_plural(args[0])}"
    return {int: "an integer", float: "a finite number", str: "a string", bool: "true or false", dict: "an object"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _plural(tp) -> str:
    return {int: "integers", float: "finite numbers", str: "strings", bool: "booleans"}.get(tp, expected(tp))


def _conform(value, tp) -> tuple[bool, object]:
    """(whether ``value`` fits ``tp``, the value as the dataclass keeps it: a tuple for a list, a float for an int)."""
    for part in _parts(tp):
        if part is _NONE:
            if value is None:
                return True, None
        elif typing.get_origin(part) is tuple:
            args = typing.get_args(part)
            if not isinstance(value, (list, tuple)):
                continue
            kinds = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
            if len(kinds) != len(value):
                continue
            items = [_conform(v, k) for v, k in zip(value, kinds, strict=True)]
            if all(ok for ok, _ in items):
                return True, tuple(v for _, v in items)
        elif part is bool:
            if isinstance(value, bool):
                return True, value
        elif part is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True, value
        elif part is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                return True, float(value)
        elif isinstance(part, type) and isinstance(value, part):
            return True, value
    return False, value


def check_value(value, tp, key: str):
    """``value`` as the annotation ``tp`` keeps it, or a ``TinyDiTError`` naming ``key``, the value and what was
    expected."""
    ok, kept = _conform(value, tp)
    if not ok:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise TinyDiTError(f"{key} must be {expected(tp)}, got {shown}")
    return kept


@functools.cache  # one resolution of the annotations per class
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def check_fields(cls: type, record: dict, key: str | None, names=None) -> dict:
    """The values of ``record`` for the fields ``names`` of the dataclass ``cls`` (default: every field the
    record holds), each checked against its annotation. Errors name ``key.field``; for key "" the field alone
    (a file's top-level key), for None the field as a parameter in backticks (`steps`), as the library's
    errors name their parameters."""
    hints = _hints(cls)
    names = [n for n in (names or [f.name for f in dataclasses.fields(cls)]) if n in record]
    named = {n: f"{key}.{n}" if key else n if key == "" else f"`{n}`" for n in names}
    return {n: check_value(record[n], hints[n], named[n]) for n in names}


def build(cls: type, record, key: str, unknown: str = "refuse"):
    """The dataclass ``cls`` from the dict ``record`` found under ``key`` in a file: its types checked by the
    annotations, then its ranges and consistency by ``cls`` itself, every error naming ``key`` and the field.
    A key ``cls`` does not know is refused by name (``unknown="refuse"``) or left out (``"drop"``)."""
    if not isinstance(record, dict):
        raise TinyDiTError(f"{key} must be an object, got {record!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    extra = sorted(str(k) for k in record if k not in known)
    if extra and unknown == "refuse":
        raise TinyDiTError(f"{key} holds unknown keys {', '.join(extra)}: written by a newer tinydit, or edited")
    values = check_fields(cls, {k: v for k, v in record.items() if k in known}, key)
    with as_key(key):
        return cls(**values)


@contextlib.contextmanager
def as_key(key: str) -> Iterator[None]:
    """A ``TinyDiTError`` from a record's own checks told as the record's: a parameter it names in backticks
    (`steps`) becomes the key (train_config.steps), which the CLI does not mistake for a flag of its own;
    a message without one is prefixed with the key."""
    try:
        yield
    except TinyDiTError as err:
        message, n = re.subn(r"`(\w+)`", lambda m: f"{key}.{m[1]}", str(err))
        raise TinyDiTError(message if n else f"{key}: {message}") from err


@contextlib.contextmanager
def reading(where: str, fix: str) -> Iterator[None]:
    """Every ``TinyDiTError`` raised inside as one line that starts with the file ``where`` and ends with ``fix``."""
    try:
        yield
    except TinyDiTError as err:
        raise TinyDiTError(f"{where}: {err}; {fix}") from err


def check_text(value, param: str, what: str) -> str:
    """A name or path given by a user, refused by ``param`` when it is blank (an empty or all-blank string says
    nothing, and a blank path is the current folder) or holds a NUL (no file name can). Spaces inside stay."""
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str) or not text.strip():
        raise TinyDiTError(f"`{param}` is {'empty' if text == '' else repr(text)}: give {what}")
    if "\x00" in text:
        raise TinyDiTError(f"`{param}` {text!r} holds a NUL character, which no file name can: give {what}")
    return value
