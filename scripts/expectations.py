"""The "What to expect" tables of README.md and docs/index.md: their rows are data (docs/expectations.json),
and this script adds rows from runs and writes the tables into both pages.

    tinydit train --data shapes --minutes 5 --out runs/shapes
    tinydit eval --checkpoint runs/shapes/checkpoint.pt --n 1000 --out eval/shapes
    python scripts/expectations.py runs/shapes:eval/shapes [RUN:EVAL ...] --machine "2-core AMD EPYC, ..." --add
    python scripts/expectations.py --write      # the pages' tables from docs/expectations.json
    python scripts/expectations.py --check      # exit 1 where a page's table differs from the data (a test runs it)

Each RUN:EVAL pair is a run directory (its config.json and metrics.jsonl, written by `tinydit train`) and
the folder `tinydit eval --out` wrote for it (metrics.json, which holds the exact eval command). A row
gives the machine, precision, torch version, date, seed, steps, the scores and the two commands; the
train command is the shortest one equivalent to the run's resolved config (the flags whose values differ
from the defaults for its data set). `shapes` class runs fill the shapes table (the strict judge, per
kind), Fashion-MNIST runs the Fashion-MNIST table (`fid_fmnist_cnn`). Without --add the rows are printed;
a row is a measurement, so it keeps its date. In the pages each table sits between
``<!-- expectations: NAME -->`` and ``<!-- /expectations -->``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
from dataclasses import fields
from pathlib import Path

from tinydit.config import TrainConfig
from tinydit.train.resolve import resolve

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "expectations.json"
PAGES = (ROOT / "README.md", ROOT / "docs" / "index.md")
TABLE = re.compile(r"(<!-- expectations: ([\w-]+) -->\n).*?(\n<!-- /expectations -->)", re.S)
KINDS = ("circle", "square", "triangle", "cross")
NOT_FLAGS = ("out", "data", "minutes", "steps")  # written first, or not at all
ON_OFF = {f.name for f in fields(TrainConfig) if "bool" in str(f.type) and "None" in str(f.type)}  # --qk-norm on


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def this_machine() -> str:
    """'2-core Intel(R) Xeon(R) Processor, AMX' from /proc/cpuinfo, or the platform's processor name."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    names = re.findall(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = set(re.search(r"^flags\s*:\s*(.+)$", info, re.M)[1].split()) if "flags" in info else set()
    extras = [
        name
        for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 with bf16"), ("avx512f", "AVX-512"))
        if flag in flags
    ]
    extra = extras[0] if extras else "no AVX-512"
    return f"{len(names)}-core {names[0] if names else platform.machine()}, {extra}"


def flag_words(name: str, value) -> list[str]:
    """The `tinydit train` flag words that set TrainConfig field ``name`` to ``value``."""
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool) and name in ON_OFF:
        return [flag, "on" if value else "off"]
    if isinstance(value, bool):  # a plain switch: --name turns it on, --no-name off
        return [flag] if value else ["--no-" + name.replace("_", "-")]
    if isinstance(value, list | tuple):
        return [flag, *(f"{v:g}" for v in value)]
    return [flag, f"{value:g}" if isinstance(value, float) else str(value)]


def train_command(train: dict) -> str:
    """The shortest `tinydit train` command whose config resolves to ``train`` (config.json's "train")."""
    budget = {"minutes": train.get("minutes"), "steps": train.get("steps")}
    # config.json holds the resolved config, so the defaults it is compared with are resolved too
    given = TrainConfig(data=train["data"], model=train.get("model", "dit"), cond=train.get("cond"), **budget)
    defaults = resolve(given).to_dict()
    words = ["tinydit", "train", "--data", train["data"]]
    words += [w for k in ("minutes", "steps") if budget[k] is not None for w in flag_words(k, budget[k])]
    for name, value in train.items():
        if name in NOT_FLAGS or name not in defaults:
            continue
        default = defaults[name]
        if json.dumps(value) != json.dumps(list(default) if isinstance(default, tuple) else default):
            words += flag_words(name, value)
    return " ".join([*words, "--out", train["out"]])


def row(run: Path, evaluation: Path, machine: str, date: str | None) -> tuple[str, str]:
    """(table, markdown row) for one run and its evaluation."""
    config = json.loads((run / "config.json").read_text())
    records = read_jsonl(run / "metrics.jsonl")
    metrics = json.loads((evaluation / "metrics.json").read_text())
    train, data = config["train"], config["data"]["name"]
    steps = max(r["step"] for r in records if "step" in r)
    when = date or datetime.date.fromtimestamp((evaluation / "metrics.json").stat().st_mtime).isoformat()
    torch = config.get("torch_version", "?").split("+")[0]
    command = f"`{train_command(train)}`, then `{metrics.get('command') or 'tinydit eval ...'}`"
    cells = [machine, config.get("precision", "?"), torch, when, str(train["seed"]), f"{steps:,}"]
    if data == "shapes" and "shape_strict" in metrics:
        kinds = " / ".join(f"{metrics[f'shape_strict_{k}']:.3g}" for k in KINDS)
        cells += [f"**{metrics['shape_strict']:.3f}**", kinds]
        table = "shapes"
    elif data == "fashion-mnist":
        cells += [f"**{metrics['fid_fmnist_cnn']:.3f}**", f"{metrics['n_samples']:,}"]
        table = "fashion-mnist"
    else:
        raise SystemExit(f"{run}: a {data} run has no row in the tables (shapes class runs and Fashion-MNIST)")
    return table, [*cells, command]


def load() -> dict:
    """docs/expectations.json: {table: {"columns": [...], "rows": [[cell, ...], ...]}}."""
    return json.loads(DATA.read_text())


def dump(tables: dict) -> None:
    """One line per row, so that a new measurement is a one-line change."""
    parts = []
    for name, table in tables.items():
        rows = ",\n".join("      " + json.dumps(r, ensure_ascii=False) for r in table["rows"])
        columns = json.dumps(table["columns"], ensure_ascii=False)
        parts.append(f'  "{name}": {{\n    "columns": {columns},\n    "rows": [\n{rows}\n    ]\n  }}')
    DATA.write_text("{\n" + ",\n".join(parts) + "\n}\n")


def markdown(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def render(table: dict) -> str:
    """A table as markdown: header, rule, rows."""
    rule = "|" + "---|" * len(table["columns"])
    return "\n".join([markdown(table["columns"]), rule, *map(markdown, table["rows"])])


def write_pages(tables: dict, pages=None, check: bool = False) -> list[str]:
    """Put each table into the pages (default: README.md and docs/index.md) between its markers; with
    ``check``, change nothing and return the pages (and tables) whose text differs from the data."""
    stale = []
    for page in PAGES if pages is None else pages:
        text = Path(page).read_text()
        marked = list(TABLE.finditer(text))
        if sorted(m[2] for m in marked) != sorted(tables):
            raise SystemExit(f"{page}: the tables marked are {[m[2] for m in marked]}, the data has {sorted(tables)}")
        stale += [f"{page}: {m[2]}" for m in marked if m[0] != m[1] + render(tables[m[2]]) + m[3]]
        new = TABLE.sub(lambda m: m[1] + render(tables[m[2]]) + m[3], text)
        if not check and new != text:
            Path(page).write_text(new)
    return stale


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="*", metavar="RUN:EVAL", help="a run directory and its `tinydit eval --out`")
    parser.add_argument("--machine", help="the CPU or GPU the run trained on (default: this machine's CPU)")
    parser.add_argument("--date", help="the date of the measurement (default: the day metrics.json was written)")
    parser.add_argument("--add", action="store_true", help="add the rows to docs/expectations.json and the pages")
    parser.add_argument("--write", action="store_true", help="write the pages' tables from docs/expectations.json")
    parser.add_argument("--check", action="store_true", help="exit 1 where a page's table differs from the data")
    args = parser.parse_args(argv)
    if args.check:
        stale = write_pages(load(), check=True)
        if stale:
            raise SystemExit("out of date (python scripts/expectations.py --write): " + ", ".join(stale))
        return
    tables = load()
    machine = args.machine or this_machine()
    for pair in args.pairs:
        run, sep, evaluation = pair.partition(":")
        if not sep:
            parser.error(f"{pair}: give RUN:EVAL, a run directory and the folder its evaluation was written to")
        table, cells = row(Path(run), Path(evaluation), machine, args.date)
        if args.add:
            tables[table]["rows"].append(cells)
        else:
            print(render({"columns": tables[table]["columns"], "rows": [cells]}) + "\n")
    if args.add:
        dump(tables)
    if args.add or args.write:
        write_pages(tables)


if __name__ == "__main__":
    main()
