"""Command-line flags made from typed dataclass configs, and library errors told in those flags' names.

``add_config_flags`` gives every field of a config one flag (``--batch-size`` for ``batch_size``), typed
from its annotation, with its default and the comment beside it as help, in the argument group of the
section it stands in (``config_groups``), so a new option is one edit: a field with a comment. Library
errors name parameters in backticks (`steps`); ``as_flags`` puts the flag of the running command in
their place (--steps).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import re
import sys
import warnings
from argparse import SUPPRESS
from dataclasses import MISSING, fields

from tinydit.errors import TinyDiTError

__all__ = [
    "field_comments",
    "config_groups",
    "add_config_flags",
    "HelpFormatter",
    "parse_list",
    "Parser",
    "flags_of",
    "as_flags",
    "user_warnings",
]


def field_comments(cls: type) -> dict[str, str]:
    """The comment of each dataclass field: the one on its line, after any comment lines just above it."""
    comments, above = {}, []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        m = re.match(r"(\w+): [^=]+=[^#]*(?:#\s*(.*))?$", stripped)
        if m:
            comments[m[1]] = " ".join([*above, m[2] or ""]).strip()
        above = []
    return comments


# A section of a config's fields opens at a comment line "# -- title: what it holds --".
SECTION = re.compile(r"# -- (\w+): (.+) --$")
# The clause of a field's comment that says what its `None` default stands for: "...; None: the preset's".
NONE_CLAUSE = re.compile(r"[;,.]?\s*None: (.+?)\.?$")


def config_groups(cls: type) -> dict[str, tuple[str, list[str]]]:
    """The sections of the dataclass ``cls``'s fields, in order: title -> (what it holds, its field names).
    Fields above the first section stand in none."""
    names, groups, current = {f.name for f in fields(cls)}, {}, None
    for line in inspect.getsource(cls).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith(("def ", "@")):  # the methods: the fields are all above them
            break
        section, field_ = SECTION.match(stripped), re.match(r"(\w+): ", stripped)
        if section:
            current = section[1]
            groups[current] = (section[2], [])
        elif current is not None and field_ and field_[1] in names:
            groups[current][1].append(field_[1])
    return groups


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"use on or off, got {text!r}")
    return text == "on"


def _help(comment: str, default, said: str | None, flags: dict[str, str]) -> str:
    """A field's flag help: its comment, each `field` in it written as that field's flag, and for a ``None``
    default the words that say what it stands for (``said``, else the comment's "None: ..." clause)."""
    clause = NONE_CLAUSE.search(comment) if default is None else None
    if clause:
        comment = comment[: clause.start()]
    words = said or (clause[1] if clause else None)
    text = comment.rstrip(".") + (f" (default: {words})" if words else "")
    text = re.sub(r"`(\w+)`", lambda m: flags.get(m[1], m[0]), text)
    return text.replace("%", "%%")  # argparse formats help with %


def add_config_flags(
    p: argparse.ArgumentParser, cls: type, choices: dict, defaults: dict[str, str] | None = None
) -> dict[str, argparse._ArgumentGroup]:
    """One flag per field of the dataclass ``cls``: ``--batch-size`` for ``batch_size``, typed from its
    annotation, with its default, its comment as help (``_help``; ``defaults``: the words for the ``None``
    defaults filled in later) and ``choices`` where given, in the argument group of its section. Returns
    the groups by title, for the caller's own flags."""
    comments, defaults = field_comments(cls), defaults or {}
    made = {title: p.add_argument_group(title, what) for title, (what, _) in config_groups(cls).items()}
    group_of = {name: made[title] for title, (_, names) in config_groups(cls).items() for name in names}
    flags = {f.name: "--" + f.name.replace("_", "-") for f in fields(cls)}
    for f in fields(cls):
        kind = (f.type.__name__ if isinstance(f.type, type) else str(f.type)).replace(" | None", "")
        default = f.default if f.default is not MISSING else f.default_factory()
        help_ = _help(comments.get(f.name, ""), default, defaults.get(f.name), flags)
        kw: dict = {"dest": f.name, "default": default, "help": help_ or None}
        where = group_of.get(f.name, p)
        if kind == "bool" and "None" not in str(f.type):  # a plain switch: --name, or --no-name where it is on
            name = f.name.replace("_", "-")
            flag = f"--no-{name}" if default else f"--{name}"
            if default and help_:
                kw["help"] = f"do not {help_}"  # the comment says what the field does when on
            where.add_argument(flag, action="store_false" if default else "store_true", **kw)
            continue
        if kind == "bool":  # on, off, or None: the preset's choice
            kw.update(type=_on_off, metavar="{on,off}")
        elif kind.startswith("tuple["):
            kw.update(type=float, nargs=2, metavar=("LO", "HI"))
        else:
            kw["type"] = {"int": int, "float": float, "str": str}[kind]
        if f.name in choices:
            kw["choices"] = list(choices[f.name])
        where.add_argument(flags[f.name], **kw)
    return made


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default after its help, as it is typed ("0.1 0.8" for a pair); a
    switch's is "off" (the flag not given). Nothing is added where the help says the default already (a
    default chosen later, in words) or where there is none: a required flag, or a ``None`` default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_ = action.help or ""
        default = action.default
        if "(default:" in help_ or not action.option_strings or action.required or default in (None, SUPPRESS):
            return help_
        if action.nargs == 0:
            return f"{help_} (default: off)"
        shown = " ".join(map(str, default)) if isinstance(default, (tuple, list)) else str(default)
        return f"{help_} (default: {shown.replace('%', '%%')})"


def parse_list(text: str, kind: type, flag: str) -> list:
    """'4,8,16' -> [4, 8, 16] of ``kind``; a clear error naming ``flag`` otherwise."""
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    try:
        values = [kind(item) for item in items]
    except ValueError:
        example = {int: "4,8,16", float: "1,2,3"}.get(kind, "euler,heun")
        raise TinyDiTError(f"{flag} takes a comma-separated list such as {example}, got {text!r}") from None
    if not values:
        raise TinyDiTError(f"{flag} is empty; give at least one value")
    return values


# argparse takes "-1e-3" for a flag (its pattern for negative numbers has no exponent), so `--lr -1e-3`
# would fail as "expected one argument" instead of reaching the library's check of the value.
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|nan)$", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """argparse, reading negative numbers in exponent form as values."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER


def flags_of(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """Parameter name -> the flag that sets it in ``command`` (``cfg_scale`` -> ``--cfg-scale`` in sample)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    flags = {a.dest: a.option_strings[0] for a in sub._actions if a.option_strings and a.dest != "help"}
    if "cfg_scales" in flags:  # sweep: --cfg-scale holds a list of guidance scales, each checked as `cfg_scale`
        flags["cfg_scale"] = flags["cfg_scales"]
    return flags


def as_flags(message: str, flags: dict[str, str]) -> str:
    """A library message with each `param` replaced by its flag (or by its bare name where it has none)."""
    return re.sub(r"`(\w+)`", lambda m: flags.get(m[1], m[1]), message)


@contextlib.contextmanager
def user_warnings(flags: dict[str, str]):
    """TinyDiT's own warnings as one line each, in the running command's flags, without source lines:
    they are meant for users. Other libraries' warnings keep Python's filters and format, so that one
    from inside torch is neither hidden nor shown as TinyDiT's. The hooks are restored afterwards."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    python_show = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if os.path.abspath(filename).startswith(package):
            print(f"tinydit: warning: {as_flags(str(message), flags)}", file=sys.stderr)
        else:
            python_show(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.filterwarnings("default", module=r"tinydit(\.|$)")
        warnings.showwarning = show
        yield
