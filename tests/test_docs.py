"""Every `tinydit` command the front door shows (README.md and docs/index.md) parses with the real parser.

The commands are read from the pages' fenced bash blocks and from their inline code (tables, captions),
and handed to ``tinydit.cli.build_parser()``'s ``parse_args``, without running them: a renamed or removed
flag fails here, naming the page and line.
"""

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from tinydit.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/index.md")
SHELL_FENCES = ("```bash", "```sh", "```shell")
OPERATORS = {"&&", "||", ";", "|", "&"}


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command line) of every fenced shell block, continuation lines joined."""
    lines, in_block, pending, start = [], False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            in_block = not in_block and stripped in SHELL_FENCES
            continue
        if not in_block:
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        lines.append((start, pending + stripped))
        pending = ""
    return lines


def inline_lines(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every inline code span outside the fenced blocks; a span may wrap lines. A span
    of two words or fewer (`tinydit sample`) names a command and is not read as a command line."""
    outside = re.sub(r"^```.*?^```", lambda m: "\n" * m[0].count("\n"), text, flags=re.S | re.M)
    return [
        (outside.count("\n", 0, m.start()) + 1, " ".join(m[1].split()))
        for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", outside)
        if len(m[1].split()) > 2
    ]


def tinydit_argvs(line: str) -> list[list[str]]:
    """The argument lists of every `tinydit` call in one shell line: `tinydit ...`, `python -m tinydit
    ...` and `torchrun ... -m tinydit -- ...`, split at &&, ||, ; and |; other programs are skipped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    segments, current = [], []
    for token in lexer:
        if token in OPERATORS:
            segments.append(current)
            current = []
        else:
            current.append(token)
    segments.append(current)
    argvs = []
    for words in segments:
        while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value before the program
            words = words[1:]
        if words[:1] == ["tinydit"]:
            argvs.append(words[1:])
        elif "-m" in words and words[words.index("-m") + 1 : words.index("-m") + 2] == ["tinydit"]:
            rest = words[words.index("-m") + 2 :]
            argvs.append(rest[1:] if rest[:1] == ["--"] else rest)
    return argvs


def commands() -> list[tuple[str, list[str]]]:
    """(page:line, argv) of every tinydit command on the front-door pages."""
    found = []
    for page in PAGES:
        text = (ROOT / page).read_text()
        for number, line in shell_lines(text) + inline_lines(text):
            found += [(f"{page}:{number}", argv) for argv in tinydit_argvs(line)]
    return found


COMMANDS = commands()


def parse_error(argv: list[str]) -> str | None:
    """None if ``argv`` parses as a tinydit command line, else what argparse printed."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exit_:
            if exit_.code:
                return err.getvalue().strip().splitlines()[-1]
    return None


def test_the_front_door_shows_train_sample_and_eval_on_both_pages():
    for page in PAGES:
        shown = {argv[0] for where, argv in COMMANDS if where.startswith(f"{page}:") and argv}
        assert {"train", "sample", "eval"} <= shown, f"{page} shows tinydit {sorted(shown)}"


def test_readme_and_the_guide_home_show_the_same_commands():
    by_page = {page: sorted(argv for where, argv in COMMANDS if where.startswith(f"{page}:")) for page in PAGES}
    assert by_page["README.md"] == by_page["docs/index.md"]


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_every_command_on_the_front_door_parses(where, argv):
    error = parse_error(argv)
    assert error is None, f"{where}: tinydit {shlex.join(argv)}\n{error}"


@pytest.mark.parametrize(
    "line, expected",
    [
        ("tinydit sample --pretrained shapes --out a.png", [["sample", "--pretrained", "shapes", "--out", "a.png"]]),
        (
            "pip install -e . && tinydit train --data shapes --minutes 5  # five minutes",
            [["train", "--data", "shapes", "--minutes", "5"]],
        ),
        ("torchrun --nproc_per_node 2 -m tinydit -- eval --n 10 --out e", [["eval", "--n", "10", "--out", "e"]]),
        ("TINYDIT_OFFLINE=1 python -m tinydit presets", [["presets"]]),
        (
            'tinydit sample --checkpoint c.pt --prompt "a red circle" --out p.png',
            [["sample", "--checkpoint", "c.pt", "--prompt", "a red circle", "--out", "p.png"]],
        ),
        ("tensorboard --logdir runs/seen/tensorboard", []),
    ],
    ids=["tinydit", "after-pip", "torchrun", "env-and-python-m", "quoted", "other-program"],
)
def test_commands_are_read_from_shell_lines(line, expected):
    assert tinydit_argvs(line) == expected


def test_continuation_lines_are_joined():
    text = "```bash\ntinydit sweep --checkpoint c.pt \\\n    --n 10 --out s\n```\n```python\ntinydit = 1\n```\n"
    assert shell_lines(text) == [(2, "tinydit sweep --checkpoint c.pt --n 10 --out s")]


def test_inline_code_is_read_outside_fences_also_where_it_wraps():
    text = "a `tinydit sample --n 2` and `tinydit eval\n--n 3`\n```bash\ntinydit `x y z`\n```\n"
    text += "`--steps 9 --n 1` `tinydit eval`"
    assert inline_lines(text) == [(1, "tinydit sample --n 2"), (1, "tinydit eval --n 3"), (6, "--steps 9 --n 1")]
    assert [tinydit_argvs(code) for _, code in inline_lines(text)] == [
        [["sample", "--n", "2"]],
        [["eval", "--n", "3"]],
        [],
    ]


def test_a_flag_that_does_not_exist_fails():
    """The negative control: the check refuses what the real parser refuses."""
    assert parse_error(["sample", "--pretrained", "shapes", "--no-such-flag"]) is not None
    assert parse_error(["train", "--minutes", "five"]) is not None
    assert parse_error(["sample", "--pretrained", "shapes", "--out", "a.png"]) is None


def prose(text: str) -> str:
    """A page without its fenced blocks and HTML comments: what a reader reads as text."""
    return re.sub(r"<!--.*?-->", "", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), flags=re.S)


def words_and_rows(text: str) -> tuple[int, int]:
    """The words outside code blocks, and the table rows (header and rule lines not counted)."""
    outside = prose(text)
    words = len(re.findall(r"[A-Za-z0-9][\w'.,/-]*", outside))
    rows = [line for line in outside.splitlines() if line.startswith("|")]
    rules = [line for line in rows if re.fullmatch(r"\|[\s:|-]+\|?", line)]
    return words, len(rows) - 2 * len(rules)


def test_the_readme_reads_in_two_minutes():
    """At most 1,000 words outside code blocks and 10 table rows: measurements go to the record."""
    words, rows = words_and_rows((ROOT / "README.md").read_text())
    assert words <= 1000 and rows <= 10, f"README.md: {words} words, {rows} table rows"


def test_words_and_rows_are_counted_outside_code():
    text = "one two\n```bash\nthree four five\n```\n| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n<!-- six -->"
    assert words_and_rows(text) == (8, 2)


def test_every_link_of_the_readme_reaches_a_file_of_the_repository():
    """The README is read on the repository's host, where a relative link is a path from the root (the guide's
    copy, docs/index.md, is checked with its anchors by `mkdocs build --strict`)."""
    text = prose((ROOT / "README.md").read_text())
    targets = [m[1].split("#")[0] for m in re.finditer(r"\]\(([^)\s]+)\)", text)]
    local = [t for t in targets if t and not re.match(r"[a-z]+:", t)]
    assert local, "the README links nothing"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links files that do not exist: {missing}"


def test_the_pages_clone_the_repository_pyproject_names():
    """The clone URL is one setting, [project.urls] Repository; the pages that clone use it."""
    home = re.search(r'^Repository = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    for page in ("README.md", "docs/install.md"):
        clones = re.findall(r"git clone (\S+)", (ROOT / page).read_text())
        assert clones and set(clones) == {home}, f"{page} clones {clones}, pyproject names {home}"


def test_the_training_guides_defaults_are_the_codes(monkeypatch, tmp_path):
    """docs/training.md's table of what each data set trains with is made from the resolve step; a changed
    cell is caught."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("defaults_table", ROOT / "scripts" / "defaults_table.py")
    defaults = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(defaults)
    monkeypatch.setattr("sys.argv", ["defaults_table.py", "--check"])
    defaults.main()
    page = tmp_path / "training.md"
    shapes = "| `shapes` | `dit-1.4m` | 64 |"
    page.write_text(defaults.PAGE.read_text().replace(shapes, shapes.replace("64", "32")))
    monkeypatch.setattr(defaults, "PAGE", page)
    monkeypatch.setattr(defaults, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match="out of date"):
        defaults.main()
