"""What to expect: every measured run is a record in docs/expectations.json, and the pages are made from it.

    tinydit train --data shapes --minutes 5 --out runs/shapes
    tinydit eval --checkpoint runs/shapes/checkpoint.pt --n 1000 --out eval/shapes
    python scripts/expectations.py runs/shapes:eval/shapes --class cpu-amx --cache empty --add
    python scripts/expectations.py --write      # the pages from docs/expectations.json
    python scripts/expectations.py --check      # exit 1 where a page differs from the data (a test runs it)

A run is stored as fields (data set, hardware class, machine, precision, compile and cache state, torch,
date, seed, budget, steps, sample count, scores, the train and eval commands), never as formatted text.
The pages made from the record:

- README.md's "What to expect" table (between ``<!-- expectations: front -->`` and ``<!-- /expectations -->``):
  one row per entry of the record's ``front`` list. **The rule:** an entry names a hardware class, a data set,
  a budget and a precision, and a date ``since`` (the day the defaults of that command last changed what a
  step does), and may name the compile states its command runs in (a `--compile off` run is another
  command); its row gives the range, over every run of the record that matches all of these and was measured
  on or after ``since``, of the steps the budget held and of ``shape_strict``, and for each kind of shape
  in how many of those runs the strict judge passed at least 85% of it. An entry naming a shipped model
  gives that model's own run.
- docs/index.md, the guide's home page: README.md with its links made relative to docs/.
- docs/expectations.md: every run of the record, the quality by step count, and the rule above.
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
README = ROOT / "README.md"
HOME = ROOT / "docs" / "index.md"
PAGE = ROOT / "docs" / "expectations.md"
PYPROJECT = ROOT / "pyproject.toml"  # its [project.urls] Repository is the repository's home
TABLE = re.compile(r"(<!-- expectations: ([\w-]+) -->\n)(?:.*?\n)?(<!-- /expectations -->)", re.S)
KINDS = ("circle", "square", "triangle", "cross")
PLURALS = {"circle": "circles", "square": "squares", "triangle": "triangles", "cross": "crosses"}
PASS = 0.85  # a kind counts as drawn when the strict judge passes this share of its samples
STEP_BINS = (0, 1000, 2000, 3000, 4000, 5000)  # the quality-by-steps table's bins (the last one is open)
NOT_FLAGS = ("out", "data", "minutes", "steps")  # written first, or not at all
ON_OFF = {f.name for f in fields(TrainConfig) if "bool" in str(f.type) and "None" in str(f.type)}  # --qk-norm on
CACHES = ("empty", "kept")
BUDGETS = ("minutes", "steps")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def this_machine() -> str:
    """'2-core Intel(R) Xeon(R) Processor (lscpu model 207)' from /proc/cpuinfo, or the platform's name."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    names = re.findall(r"^model name\s*:\s*(.+)$", info, re.M)
    model = re.search(r"^model\s*:\s*(\d+)$", info, re.M)
    where = f" (lscpu model {model[1]})" if model else ""
    return f"{len(names)}-core {names[0] if names else platform.machine()}{where}"


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


def scores_of(data: str, metrics: dict) -> dict:
    """The scores a run of ``data`` is recorded with, read from its `tinydit eval` metrics.json."""
    if data == "shapes" and "shape_strict" in metrics:
        return {"shape_strict": metrics["shape_strict"], **{k: metrics[f"shape_strict_{k}"] for k in KINDS}}
    if data == "fashion-mnist":
        return {
            "fid_fmnist_cnn": metrics["fid_fmnist_cnn"],
            "recall": metrics.get("recall_fmnist_cnn"),
            "class_consistency": metrics.get("class_consistency_fmnist_cnn"),
        }
    raise SystemExit(f"a {data} run has no place in the record (shapes class runs and Fashion-MNIST)")


def record(run: Path, evaluation: Path, hardware: str, machine: str, cache: str | None, date: str | None) -> dict:
    """One run of the record, from a run directory and the folder its `tinydit eval --out` wrote."""
    config = json.loads((run / "config.json").read_text())
    metrics = json.loads((evaluation / "metrics.json").read_text())
    train = config["train"]
    steps = max(r["step"] for r in read_jsonl(run / "metrics.jsonl") if "step" in r)
    when = date or datetime.date.fromtimestamp((evaluation / "metrics.json").stat().st_mtime).isoformat()
    compiled = config.get("compile")
    return {
        "data": config["data"]["name"],
        "class": hardware,
        "machine": machine,
        "precision": config.get("precision"),
        "compile": (cache + " cache" if cache else "on") if compiled else "off",
        "torch": config.get("torch_version", "?").split("+")[0],
        "date": when,
        "seed": train["seed"],
        # 5.0 minutes as 5, so that it reads and compares as the front entries write it
        "budget": {k: round(train[k]) if train[k] == round(train[k]) else train[k] for k in BUDGETS if train.get(k)},
        "steps": steps,
        "samples": metrics.get("n_samples"),
        "scores": scores_of(config["data"]["name"], metrics),
        "train": train_command(train),
        "eval": metrics.get("command"),
    }


def load(path: Path | None = None) -> dict:
    """docs/expectations.json: {"classes": {id: name}, "front": [entry, ...], "runs": [run, ...]}."""
    return json.loads((path or DATA).read_text())


def dump(data: dict, path: Path | None = None) -> None:
    """One line per run, so that a new measurement is a one-line change."""
    parts = [f'  "{key}": {json.dumps(data[key], ensure_ascii=False)}' for key in data if key not in ("front", "runs")]
    for key in ("front", "runs"):
        lines = ",\n".join("    " + json.dumps(item, ensure_ascii=False) for item in data[key])
        parts.append(f'  "{key}": [\n{lines}\n  ]')
    (path or DATA).write_text("{\n" + ",\n".join(parts) + "\n}\n")


# ---- the tables -------------------------------------------------------------------------------------------


def markdown(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table(columns: list[str], rows: list[list[str]]) -> str:
    return "\n".join([markdown(columns), "|" + "---|" * len(columns), *map(markdown, rows)])


def span(values: list[float], form: str) -> str:
    """'a-b' over the values (one value alone), in ``form``."""
    lo, hi = min(values), max(values)
    return format(lo, form) if format(lo, form) == format(hi, form) else f"{lo:{form}}–{hi:{form}}"


def drawn(runs: list[dict]) -> str:
    """What the runs draw, by kind: 'every shape in every run', or the kinds and in how many runs each passed."""
    counts = {}
    for kind in KINDS:
        known = [r["scores"][kind] for r in runs if r["scores"].get(kind) is not None]
        counts[kind] = (sum(s >= PASS for s in known), len(known))
    if all(n and k == n for k, n in counts.values()):
        return "every shape in every run" if len(runs) > 1 else "every shape"
    always = [PLURALS[kind] for kind, (k, n) in counts.items() if n and k == n]
    parts = [" and ".join([", ".join(always[:-1]), always[-1]] if len(always) > 1 else always) + " in every run"]
    parts = parts if always else []
    parts += [f"{PLURALS[kind]} in {k} of {n}" for kind, (k, n) in counts.items() if n and 0 < k < n]
    parts += [f"no {PLURALS[kind]}" for kind, (k, n) in counts.items() if n and k == 0]
    unknown = [kind for kind, (k, n) in counts.items() if not n]
    return "; ".join(parts + (["other kinds not recorded"] if unknown else []))


def matches(entry: dict, run: dict) -> bool:
    if "shipped" in entry:
        return run.get("shipped") == entry["shipped"]
    return (
        run["scores"] is not None
        and all(run[key] == entry[key] for key in ("class", "data", "budget", "precision"))
        and run["date"] >= entry["since"]
        and run["compile"] in entry.get("compile", [run["compile"]])
    )


def front_rows(data: dict) -> list[list[str]]:
    rows = []
    for entry in data["front"]:
        runs = [r for r in data["runs"] if matches(entry, r)]
        if not runs:
            raise SystemExit(f"the front entry {entry} matches no run of the record")
        strict = span([r["scores"]["shape_strict"] for r in runs], ".2f")
        steps = span([r["steps"] for r in runs], ",")
        rows.append([entry["hardware"], f"`{entry['command']}`", entry["takes"], steps, strict, drawn(runs)])
    return rows


FRONT_COLUMNS = ["hardware", "command", "takes", "steps", "`shape_strict`", "what you get"]


def front(data: dict) -> str:
    return table(FRONT_COLUMNS, front_rows(data))


def budget_words(budget: dict) -> str:
    return f"{budget['minutes']} min" if "minutes" in budget else f"{budget['steps']:,} steps"


def shapes_by_steps(runs: list[dict]) -> str:
    rows = []
    for lo, hi in zip(STEP_BINS, (*STEP_BINS[1:], None), strict=True):
        inside = [r for r in runs if r["steps"] >= lo and (hi is None or r["steps"] < hi)]
        if not inside:
            continue
        where = f"{lo:,}–{hi - 1:,}" if hi else f"{lo:,} or more"
        strict = span([r["scores"]["shape_strict"] for r in inside], ".3f")
        rows.append([where, str(len(inside)), strict, drawn(inside)])
    return table(["steps", "runs", "`shape_strict`", "what they draw (each kind passed at 85% or more)"], rows)


def speeds(data: dict) -> str:
    """Steps per second of the time-budgeted runs, by data set, hardware class, precision and compile state:
    a budget's minutes times this rate is the step count it holds (the first minute of a compiled run from
    an empty cache is partly spent compiling)."""
    groups: dict[tuple, list[float]] = {}
    for r in data["runs"]:
        if "minutes" in r["budget"]:
            key = (r["data"], r["class"], r["precision"], r["compile"] or "?")
            groups.setdefault(key, []).append(r["steps"] / (60 * r["budget"]["minutes"]))
    rows = [
        [name, data["classes"][hardware], precision, compiled, str(len(rates)), span(rates, ".1f")]
        for (name, hardware, precision, compiled), rates in sorted(groups.items())
    ]
    return table(["data", "hardware", "precision", "compile", "runs", "steps per second"], rows)


def run_rows(runs: list[dict], score_cells) -> list[list[str]]:
    return [
        [
            r["machine"],
            r["precision"],
            r["compile"] or "?",
            r["torch"],
            r["date"],
            str(r["seed"]),
            budget_words(r["budget"]),
            f"{r['steps']:,}",
            *score_cells(r),
            f"`{r['train']}`"
            + (f", then `{r['eval']}`" if r.get("eval") else "")
            + (f"; *{r['note']}*" if r.get("note") else ""),
        ]
        for r in sorted(runs, key=lambda r: (r["class"], *sorted(r["budget"].items()), r["date"], r["seed"]))
    ]


RUN_COLUMNS = ["machine", "precision", "compile", "torch", "date", "seed", "budget", "steps"]


def shapes_cells(r: dict) -> list[str]:
    s = r["scores"]
    if s is None:
        return ["not evaluated", ""]
    kinds = " / ".join("?" if s.get(k) is None else f"{s[k]:.3g}" for k in KINDS)
    return [f"**{s['shape_strict']:.3f}**", kinds]


def fashion_cells(r: dict) -> list[str]:
    s = r["scores"]
    pairs = (("recall", "recall"), ("class_consistency", "classes"))
    extra = ", ".join(f"{name} {s[key]:.3f}" for key, name in pairs if s.get(key) is not None)
    return [f"**{s['fid_fmnist_cnn']:.3f}**", extra or "?", f"{r['samples']:,}"]


def sample_words(runs: list[dict]) -> str:
    """The sample count the runs were scored with: '1,000 samples each', or the counts where they differ."""
    counts = sorted({r["samples"] for r in runs if r.get("samples")})
    if len(counts) == 1:
        return f"{counts[0]:,} samples each"
    return "samples " + " or ".join(f"{n:,}" for n in counts) + " (as each row says)"


def page(data: dict) -> str:
    shapes = [r for r in data["runs"] if r["data"] == "shapes"]
    scored = [r for r in shapes if r["scores"] is not None]
    fashion = [r for r in data["runs"] if r["data"] == "fashion-mnist"]
    rule = __doc__.split("**The rule:** ")[1].split("\n- ")[0]
    return "\n".join(
        [
            "# What to expect: every measured run",
            "",
            "<!-- Written by `python scripts/expectations.py --write` from docs/expectations.json; edit those. -->",
            "",
            "Every run below is a record in `docs/expectations.json`, with the commands that made it. The front",
            "page's table is chosen from these records by a rule: " + " ".join(rule.split()),
            "",
            front(data),
            "",
            "## Shapes: quality follows the step count",
            "",
            "The number of steps a run held, not its minutes, decides what it draws; the minutes a machine needs",
            "for a step count are in the tables below and in [Speed](speed.md). Every scored `shapes` run,",
            f"{sample_words(scored)}, at the sampler settings its checkpoint records:",
            "",
            shapes_by_steps(scored),
            "",
            "## Speed: steps per second by hardware",
            "",
            "The rate of every time-budgeted run above and below: its steps over its minutes. A run's first",
            "seconds go to loading the data and, from an empty compile cache, to compiling; shared cloud",
            "machines also vary from hour to hour, which the ranges show. `python benchmarks/bench_train.py`",
            "measures the bare step on your machine ([Speed](speed.md)).",
            "",
            speeds(data),
            "",
            "## Shapes: every run",
            "",
            f"`shape_strict` is the share of the samples ({sample_words(scored)}) in which the [strict shapes judge]"
            "(evaluation.md#the-strict-shapes-judge) finds one clean shape of the kind asked for; then per kind"
            " (circles / squares / triangles / crosses). *compile*: `off` is eager, `empty cache` and"
            " `kept cache` say whether the compiled kernels were built in the run or read from an earlier one.",
            "",
            table([*RUN_COLUMNS, "`shape_strict`", "per kind", "commands"], run_rows(shapes, shapes_cells)),
            "",
            "## Fashion-MNIST: every run",
            "",
            "`fid_fmnist_cnn` is FID in a shipped classifier's feature space (lower is better; real training"
            " images score about 0.08, [Reading the metrics](metrics.md)), with recall and class consistency"
            " in the same network, of the row's samples against the 10,000 test images, drawn in fp32 at the"
            " sampler settings its checkpoint records. FIDs of different sample counts do not compare (fewer"
            " samples score higher): [which numbers compare](evaluation.md#which-numbers-compare).",
            "",
            table(
                [*RUN_COLUMNS, "`fid_fmnist_cnn`", "recall, classes", "samples", "commands"],
                run_rows(fashion, fashion_cells),
            ),
            "",
        ]
    )


def home(readme: str) -> str:
    """docs/index.md from README.md: links into docs/ lose the prefix, links to other files of the
    repository point at it on its home (mkdocs serves only docs/)."""
    home = re.search(r'^Repository = "(.+)"$', PYPROJECT.read_text(), re.M)

    def link(m: re.Match) -> str:
        target = m[2]
        if re.match(r"[a-z]+:|#", target):
            return m[0]
        if target.startswith("docs/"):
            return f"{m[1]}({target[len('docs/') :]})"
        return f"{m[1]}({home[1] if home else '..'}/blob/main/{target})"

    body = re.sub(r"(\])\(([^)\s]+)\)", link, readme)
    note = "<!-- Written by `python scripts/expectations.py --write` from README.md; edit that. -->\n"
    return body.replace("\n", "\n\n" + note, 1) if note not in body else body


def pages(data: dict) -> dict[Path, str]:
    """Every page made from the record, as it should read."""
    readme = README.read_text()
    marked = [m[2] for m in TABLE.finditer(readme)]
    if marked != ["front"]:
        raise SystemExit(f"{README}: the tables marked are {marked}; it holds one, 'front'")
    readme = TABLE.sub(lambda m: m[1] + front(data) + "\n" + m[3], readme)
    return {README: readme, HOME: home(readme), PAGE: page(data)}


def write(data: dict, check: bool = False) -> list[str]:
    """Write the pages; with ``check``, change nothing and return those whose text differs."""
    stale = []
    for path, text in pages(data).items():
        if not path.exists() or path.read_text() != text:
            stale.append(str(path.relative_to(ROOT)))
            if not check:
                path.write_text(text)
    return stale


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="*", metavar="RUN:EVAL", help="a run directory and its `tinydit eval --out`")
    parser.add_argument("--class", dest="hardware", help="the hardware class, one of the record's 'classes'")
    parser.add_argument("--machine", help="the CPU or GPU the run trained on (default: this machine's CPU)")
    parser.add_argument("--cache", choices=CACHES, help="a compiled run's compile cache: empty, or kept from before")
    parser.add_argument("--date", help="the date of the measurement (default: the day metrics.json was written)")
    parser.add_argument("--add", action="store_true", help="add the runs to docs/expectations.json, write the pages")
    parser.add_argument("--write", action="store_true", help="write the pages from docs/expectations.json")
    parser.add_argument("--check", action="store_true", help="exit 1 where a page differs from the record")
    args = parser.parse_args(argv)
    data = load()
    if args.check:
        stale = write(data, check=True)
        if stale:
            raise SystemExit("out of date (python scripts/expectations.py --write): " + ", ".join(stale))
        return
    if args.pairs and args.hardware not in data["classes"]:
        parser.error(f"--class {args.hardware}: give one of {', '.join(data['classes'])}")
    for pair in args.pairs:
        run, sep, evaluation = pair.partition(":")
        if not sep:
            parser.error(f"{pair}: give RUN:EVAL, a run directory and the folder its evaluation was written to")
        entry = record(
            Path(run), Path(evaluation), args.hardware, args.machine or this_machine(), args.cache, args.date
        )
        if args.add:
            data["runs"].append(entry)
        else:
            print(json.dumps(entry, ensure_ascii=False))
    if args.add:
        dump(data)
    if args.add or args.write:
        write(data)


if __name__ == "__main__":
    main()
