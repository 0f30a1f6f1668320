"""The user pages speak to users, and what they say of the code is what the code does.

User pages are README.md and every docs/*.md but the changelog. Experiment logs, with the commits they
measured and the hours the machine ran slow or fast, live in docs/notes/; a user page states a number with
its command, machine, torch version and date, and links to a note for why. The first test reads each user
page for a lab log's phrases and for bare commit hashes, naming page and line. The later tests check
claims a page makes about the code against the code itself.
"""

import ast
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from tinydit.config import TrainConfig
from tinydit.eval import plot, sweep
from tinydit.flow.objectives import DEFAULT_OBJECTIVE, OBJECTIVES
from tinydit.flow.settings import SAMPLING_RECORDS
from tinydit.runtime import COMPILE_CPU_MINUTES, resolve_compile
from tinydit.train.resolve import resolve

ROOT = Path(__file__).resolve().parents[1]
USER_PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if p.name != "changelog.md"))

# Phrases of a lab log: which hour of a shared machine a run fell on, what a piece of work aimed for, "this
# change" and git's HEAD. A page read months later by a stranger has no such hour, aim, change or HEAD.
LAB_PHRASES = re.compile(r"\b(?:slow\s+hour|fast\s+hour|aimed\s+for|this\s+change)\b", re.IGNORECASE)
GIT_HEAD = re.compile(r"\bHEAD\b")
# A commit hash: 7 to 40 lowercase hex digits holding at least one digit and one letter, as a whole word.
# Not part of a longer name (`weights-inception-2015-12-05-6726825d.pth`, `run_ab12cd3`, a path segment),
# nor a hex colour (`#1f77b4`), nor a longer digest (64 hex digits).
COMMIT_HASH = re.compile(r"(?<![\w#./-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])(?!\.\w)")
# A hash of letters only (dfaeabd) or digits only (3390733) reads as a word or a number, so it counts only
# where a commit is named: after "commit", "--base", "worktree of", "tree at" or "clone of".
NAMED_COMMIT = re.compile(
    r"(?:\b(?:commits?|worktree of|tree at|clone of)|(?<![\w-])--base)\s+`?([0-9a-f]{7,40})(?![\w-])(?!\.\w)"
)


def read(page: str) -> str:
    return (ROOT / page).read_text()


def commit_hashes(text: str) -> list[tuple[int, str]]:
    """(offset, hash) of every commit hash in ``text``, each once."""
    found = {m.start(): m[0] for m in COMMIT_HASH.finditer(text)}
    found |= {m.start(1): m[1] for m in NAMED_COMMIT.finditer(text)}
    return sorted(found.items())


def offences(text: str) -> list[tuple[int, str]]:
    """(line, what) of every lab phrase, HEAD and commit hash in ``text``; a phrase may wrap lines."""
    found = [(m.start(), m[0]) for pattern in (LAB_PHRASES, GIT_HEAD) for m in pattern.finditer(text)]
    found += commit_hashes(text)
    return sorted((text.count("\n", 0, start) + 1, " ".join(what.split())) for start, what in found)


@pytest.mark.parametrize("page", USER_PAGES)
def test_a_user_page_carries_no_lab_log_phrases_and_no_commit_hashes(page):
    found = offences(read(page))
    where = "\n".join(f"{page}:{line}: {what!r}" for line, what in found)
    assert not found, f"move the log to docs/notes/, or name the row by what it is and date it:\n{where}"


@pytest.mark.parametrize(
    "text",
    [
        "at commit f60b2ec, fp32",
        "`--base 3390733`",
        "| bdd3bca | 0 | on |",
        "a worktree of dfaeabd.",
        "a clean clone of 6b2b42a's tree",
        "(72c81a6)",
        "c5c6f07a1b2e3d4f5a6b7c8d9e0f1a2b3c4d5e6f",
    ],
)
def test_the_hash_patterns_find_commits(text):
    assert len(commit_hashes(text)) == 1, text


@pytest.mark.parametrize(
    "text",
    [
        "`weights-inception-2015-12-05-6726825d.pth`",
        "colour #1f77b4 and #aabbcc",
        "2026-12-06, 1234567 images",
        "deadbeef, a defaced page",
        "run_ab12cd3 and runs/ab12cd3/x",
        "1e-3 and 3e-4",
        "sha256 " + "0123456789abcdef" * 4,
        "f60b2e",
        "the commits 1,432 and 1,388",
    ],
)
def test_the_hash_patterns_leave_file_names_colours_words_numbers_and_digests(text):
    assert commit_hashes(text) == [], text


def test_lab_phrases_are_found_across_a_line_break_and_named_by_line():
    text = "first\non a slow\nhour, `HEAD` against a worktree of\ndfaeabd; this changes nothing\n"
    assert offences(text) == [(2, "slow hour"), (3, "HEAD"), (4, "dfaeabd")]


def section(text: str, heading: str) -> str:
    """The text under ``heading`` (a whole line) up to the next heading of its level or above."""
    level = heading.split()[0]
    start = text.index(f"\n{heading}\n")
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", text[start + 1 :], re.M)][1:]
    end = start + 1 + ends[0] if ends else len(text)
    return " ".join(text[start:end].split())


def test_few_step_sampling_names_every_few_step_objective():
    text = section(read("docs/sampling.md"), "## Few-step sampling")
    missing = [name for name in OBJECTIVES if name != DEFAULT_OBJECTIVE and f"`--objective {name}`" not in text]
    assert not missing, f"docs/sampling.md's Few-step sampling leaves out --objective {', '.join(missing)}"


def test_the_sweep_plot_is_said_to_be_drawn_with_the_library_that_draws_it():
    assert sweep.line_plot is plot.line_plot
    tree = ast.parse(Path(plot.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    libraries = {name.split(".")[0] for name in imported} - set(sys.stdlib_module_names) - {"tinydit", "__future__"}
    assert libraries == {"matplotlib"}, libraries
    said = next(p for p in read("docs/sampling.md").split("\n\n") if "`sweep.png`" in p)
    assert "drawn with matplotlib" in said and "no matplotlib" not in said, said


def test_mean_flow_runs_on_shapes_align_by_default_as_the_pages_say():
    def repa(objective: str) -> float:
        return resolve(TrainConfig(data="shapes", objective=objective, minutes=15)).repa

    assert repa("meanflow") == repa("flow") > 0 and repa("shortcut") == 0
    few_step = " ".join(read("docs/few_step.md").split())
    training = " ".join(read("docs/training.md").split())
    assert "REPA alignment as plain runs do: on by default on shapes" in few_step
    assert "a `--objective meanflow` run aligns as a plain one does, a shortcut or distilled one does not" in training
    assert not re.search(r"\|\s*0 \(the default\)", few_step), "docs/few_step.md labels --repa 0 the default"


def test_every_sampling_record_has_its_row_and_names_the_reader_that_chose_it():
    rows = {line.split("|")[1].strip(): line for line in read("docs/sampling.md").splitlines() if line.startswith("| ")}
    lenient = []
    for record in json.loads(SAMPLING_RECORDS.read_text())["records"]:
        data = {"fashion-mnist": "Fashion-MNIST"}.get(record["data"], record["data"])
        key = f"{data}, `{record['preset']}`, {record['cond']}"
        assert key in rows, f"docs/sampling.md has no row for the record {key}"
        by_read_shape = "read_shape" in record["source"]
        assert by_read_shape == ("read_shape" in rows[key]), f"docs/sampling.md's row {key}: which reader chose it"
        if by_read_shape:
            lenient.append(record["preset"])
    evaluation = " ".join(read("docs/evaluation.md").split())
    said = evaluation[evaluation.index("rest on `read_shape`") :].split("## ")[0]
    assert lenient and all(f"`{preset}`" in said for preset in lenient), said


def test_the_pages_give_the_cpu_compile_rule_of_the_code():
    cpu = torch.device("cpu")
    assert not resolve_compile("auto", cpu) and not resolve_compile("auto", cpu, COMPILE_CPU_MINUTES - 1)
    speed = next(line for line in read("docs/speed.md").splitlines() if line.startswith("| `--compile` |"))
    assert f"`--minutes` run of at least {COMPILE_CPU_MINUTES:g} minutes" in speed, speed
    benchmarks = " ".join(read("benchmarks/README.md").split())
    assert f"`--minutes` run of {COMPILE_CPU_MINUTES:g} minutes or more" in benchmarks
    assert "a `--steps` run and sampling stay eager" in benchmarks
