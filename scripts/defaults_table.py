"""The Training guide's table of what `tinydit train --data NAME` resolves to, made from the code itself.

    python scripts/defaults_table.py --write    # docs/training.md's table, between its markers
    python scripts/defaults_table.py --check    # exit 1 where the page differs from the code (a test runs it)

Each row is ``tinydit.train.resolve.resolve`` of a class run of one data set with a time budget (an image
folder's row from an empty folder of that kind), and the sampler settings its checkpoint records
(``tinydit.flow.settings.recommended_sampling``), so the page cannot quote a default the code no longer has.
The table sits between ``<!-- defaults -->`` and ``<!-- /defaults -->``.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

from tinydit.config import TrainConfig
from tinydit.data.registry import BUILTIN_DATASETS
from tinydit.flow.settings import recommended_sampling
from tinydit.runtime import COMPILE_CPU_MINUTES
from tinydit.train.resolve import resolve

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "training.md"
MARKED = re.compile(r"(<!-- defaults -->\n)(?:.*?\n)?(<!-- /defaults -->)", re.S)
DATA = BUILTIN_DATASETS  # every built-in set has a row


def sampler_words(settings) -> str:
    guidance = f", guidance {settings.cfg_scale:g}" if settings.cfg_scale != 1 else ""
    where = f" on t in [{settings.cfg_interval[0]:g}, {settings.cfg_interval[1]:g}]" if settings.cfg_interval else ""
    return f"{settings.sampler} {settings.steps}{guidance}{where}"


def row(name: str, data: str) -> list[str]:
    cfg = resolve(TrainConfig(data=data, minutes=5))
    settings = recommended_sampling(cfg.data, cfg.preset, cfg.cond)
    times = cfg.t_sampling + (f", shift {cfg.t_shift:g}" if cfg.t_shift != 1 else "")
    return [
        name,
        f"`{cfg.preset}`",
        str(cfg.batch_size),
        f"{cfg.lr:g}",
        f"{cfg.repa:g}" if cfg.repa else "off",
        times,
        "on" if cfg.flip else "off",
        sampler_words(settings),
    ]


def table() -> str:
    with tempfile.TemporaryDirectory() as folder:
        rows = [row(f"`{name}`", name) for name in DATA] + [row("an image folder", folder)]
    columns = ["`--data`", "preset", "batch", "learning rate", "REPA", "training times", "flips", "sampler"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    compile_note = (
        "Every row compiles on CUDA, and on a CPU with a C++ compiler a `--minutes` run where this machine's "
        f"earlier runs of it held more steps compiled, or, with none recorded yet, one of {COMPILE_CPU_MINUTES:g} "
        "minutes or more (`--compile auto`); the precision is the fastest measured (`--precision auto`)."
    )
    return "\n".join(lines) + "\n\n" + compile_note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write the table into docs/training.md")
    parser.add_argument("--check", action="store_true", help="exit 1 where the page's table differs from the code")
    args = parser.parse_args()
    text = PAGE.read_text()
    if not MARKED.search(text):
        raise SystemExit(f"{PAGE}: no <!-- defaults --> ... <!-- /defaults --> markers")
    new = MARKED.sub(lambda m: m[1] + table() + "\n" + m[2], text)
    if args.check:
        if new != text:
            raise SystemExit(f"{PAGE.relative_to(ROOT)}: the defaults table is out of date (--write)")
    elif args.write:
        PAGE.write_text(new)
    else:
        print(table())


if __name__ == "__main__":
    main()
