"""``tinydit report RUN_DIR``: one self-contained HTML page of a training run, RUN_DIR/report.html.

Everything comes from the files the run wrote (``config.json``, ``metrics.jsonl``, ``samples/``,
``samples.png``, and the ``metrics.json`` of any ``tinydit eval --out`` inside RUN_DIR), and every
picture is embedded as a PNG data URI, so the page opens anywhere, offline, and can be mailed as one
file. Curves are drawn with matplotlib.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from tinydit.errors import TinyDiTError
from tinydit.eval.protocol import describe_protocol, protocol_of
from tinydit.files import read_lines, write_text

__all__ = ["write_run_report", "read_metrics", "VAL_KEYS", "val_loss_even_t"]

DPI = 100
STRIP_MAX = 24  # sample grids shown in the strip over training (evenly chosen, the last always in)


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of metrics.jsonl (a torn last line, from a run killed mid-write, is skipped)."""
    return read_lines(run_dir / "metrics.jsonl")


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return _data_uri(buf.getvalue())


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _file_uri(path: Path) -> str:
    return _data_uri(path.read_bytes())


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [s for s, _ in pts], [v for _, v in pts]


# metrics.jsonl's validation losses: at the fixed draw of the run's training times, and at times spread evenly
# over [0, 1] (``tinydit.train.diagnostics``). Runs from before the training-time one, and students (on their
# teacher's paths), wrote the even-t losses as val_loss and val_loss_ema.
VAL_KEYS = {
    "train_t": ("val_loss_train_t", "val_loss_ema_train_t"),
    "even_t": ("val_loss_even_t", "val_loss_ema_even_t"),
    "old": ("val_loss", "val_loss_ema"),
}


def val_loss_even_t(record: dict, ema: bool = True) -> float | None:
    """A validation record's loss at even t (the EMA's, or the raw weights'), new key or old; None where none."""
    i = 1 if ema else 0
    return record.get(VAL_KEYS["even_t"][i], record.get(VAL_KEYS["old"][i]))


def _why_curves_differ(config: dict) -> str:
    """One sentence: why the validation at the training times and the one at even t differ."""
    train = config.get("train", {})
    draw = str(train.get("t_sampling", "its own distribution"))
    if train.get("t_shift") not in (None, 1, 1.0):
        draw += f", shifted by {train['t_shift']:g}"
    why = (
        "the loss is a velocity error, which for this x-prediction model is its image error over t, so the "
        "even-t mean is dominated by t < 0.1, which training rarely samples"
        if config.get("model", {}).get("pred") == "x"
        else "the loss depends strongly on t (the loss by t below), so its mean depends on which times are drawn"
    )
    return (
        f"Both validations use the same held-out images and noise, labels kept; they differ in their times only: "
        f"the left one draws them once, fixed, from the training distribution ({draw}) and estimates what "
        f"the training loss does, the right one spreads them evenly over [0, 1], as every run does, and {why}: "
        "the two are not comparable with each other, and a gap between them is not overfitting."
    )


def _loss_plot(records: list[dict], distilled: bool = False) -> str | None:
    """The training loss beside the validation at the training times, and the validation at even t (a student:
    on its teacher's paths) on an axis of its own."""
    from matplotlib.figure import Figure  # here: matplotlib costs a second at start-up

    even_label = "on the teacher's paths" if distilled else "at even t over [0, 1]"
    panels = (
        (
            "At the training times",
            (
                ("loss", "training loss"),
                (VAL_KEYS["train_t"][0], "validation"),
                (VAL_KEYS["train_t"][1], "validation (EMA)"),
            ),
        ),
        (
            f"Validation {even_label}",
            (
                (VAL_KEYS["even_t"][0], "validation"),
                (VAL_KEYS["even_t"][1], "validation (EMA)"),
                (VAL_KEYS["old"][0], "validation"),
                (VAL_KEYS["old"][1], "validation (EMA)"),
            ),
        ),
    )
    drawn = [(title, curves) for title, curves in panels if any(_series(records, k)[0] for k, _ in curves)]
    if not drawn:
        return None
    fig = Figure(figsize=(5 * len(drawn), 4), dpi=DPI, layout="constrained")
    for i, (title, curves) in enumerate(drawn):
        ax = fig.add_subplot(1, len(drawn), i + 1)
        spread = 1.0
        for key, label in curves:
            steps, values = _series(records, key)
            if steps:
                many = key == "loss" and len(steps) >= 30
                ax.plot(steps, values, marker=None if many else "o", markersize=3, label=label)
                spread = max(spread, max(values) / max(min(values), 1e-12))
        ylabel = "flow-matching loss" if i == 0 else f"flow-matching loss {even_label}"
        ax.set(xlabel="step", ylabel=ylabel, yscale="log" if spread > 20 else "linear", title=title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    return _png(fig)


def _loss_by_t_plot(records: list[dict]) -> str | None:
    """The EMA's validation loss at even t in each bin of t, one line per validation (darker: later)."""
    rows = [r for r in records if isinstance(r.get("val_loss_ema_by_t"), list)]
    if not rows:
        return None
    if len(rows) > 8:
        rows = [rows[round(i * (len(rows) - 1) / 7)] for i in range(8)]
    from matplotlib.figure import Figure  # here: matplotlib costs a second at start-up

    fig = Figure(figsize=(8, 4), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    for i, r in enumerate(rows):
        by_t = r["val_loss_ema_by_t"]
        centres = [(k + 0.5) / len(by_t) for k in range(len(by_t))]
        shade = 0.25 + 0.75 * (i + 1) / len(rows)
        ax.plot(centres, by_t, marker="o", markersize=3, color=(0.12, 0.47, 0.71, shade), label=f"step {r['step']}")
    ax.set(
        xlabel="t (0 = data, 1 = noise)",
        ylabel="validation loss at even t (EMA)",
        yscale="log",
        title="Where along the path the model errs",
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncols=2)
    return _png(fig)


PLAIN = "eval/guidance_1/"  # a guided evaluation's scores at guidance 1


def _eval_plot(records: list[dict], best_metric: str | None) -> str | None:
    bookkeeping = ("seconds", "n_reference", "n_samples", "nfe", "_std")  # not quality: left to metrics.jsonl
    # the scores at guidance 1 (eval/guidance_1/NAME) are drawn on their guided score's plot, not their own
    keys = sorted(
        {
            k
            for r in records
            for k in r
            if k.startswith("eval/") and not k.startswith(PLAIN) and not any(b in k for b in bookkeeping)
        }
    )
    keys = [k for k in keys if _series(records, k)[0]]
    if not keys:
        return None
    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    from matplotlib.figure import Figure  # here: matplotlib costs a second at start-up

    fig = Figure(figsize=(4 * cols, 3 * rows), dpi=DPI, layout="constrained")
    for i, key in enumerate(keys):
        ax = fig.add_subplot(rows, cols, i + 1)
        steps, values = _series(records, key)
        ax.plot(steps, values, marker="o", markersize=3, label="as recorded")
        name = key.removeprefix("eval/")
        plain_steps, plain = _series(records, PLAIN + name)
        if plain:
            ax.plot(plain_steps, plain, marker="o", markersize=3, linestyle="--", color="grey", label="guidance 1")
            ax.legend(fontsize=8)
        if name == best_metric:
            best = [r for r in records if r.get("eval_best")]
            if best:
                ax.plot(
                    [best[-1]["step"]],
                    [best[-1][key]],
                    marker="*",
                    markersize=14,
                    color="tab:red",
                    label="best.pt",
                    linestyle="none",
                )
                ax.legend(fontsize=8)
        ax.set(title=name, xlabel="step")
        ax.grid(True, alpha=0.3)
    return _png(fig)


def _final_grid(path: Path, columns: list[str] | None, rows: list[str] | None, tile: int) -> str:
    """The last sample grid, large, pixels kept sharp, each column labelled with its class (text runs:
    each row with its prompt)."""
    with Image.open(path) as img:
        grid = np.asarray(img.convert("RGB"))
    scale = max(1, min(4, 720 // grid.shape[0]))  # at most 720 px tall, every pixel a square of `scale`
    height, width = grid.shape[0] * scale / DPI, grid.shape[1] * scale / DPI
    extra_w = 3.5 if rows else 0.0
    from matplotlib.figure import Figure  # here: matplotlib costs a second at start-up

    fig = Figure(figsize=(width + extra_w, height + 0.6), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(grid, interpolation="nearest")
    pad, step = 2, tile + 2
    if columns:
        ax.set_xticks([pad + tile / 2 + i * step for i in range(len(columns))], columns, rotation=30, ha="right")
        ax.xaxis.tick_top()
    else:
        ax.set_xticks([])
    if rows:
        ax.set_yticks([pad + tile / 2 + i * step for i in range(len(rows))], rows, fontsize=9)
    else:
        ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    return _png(fig)


def _table(pairs: list[tuple[str, object]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>" for k, v in pairs)
    return f"<table>{cells}</table>"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.5g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return str(v)


def _strip(run_dir: Path) -> str:
    grids = sorted((run_dir / "samples").glob("step_*.png"))
    if len(grids) > STRIP_MAX:
        grids = [grids[round(i * (len(grids) - 1) / (STRIP_MAX - 1))] for i in range(STRIP_MAX)]
    items = "".join(
        f'<figure><img src="{_file_uri(p)}" alt="samples at step {int(p.stem[5:])}">'
        f"<figcaption>step {int(p.stem[5:])}</figcaption></figure>"
        for p in grids
    )
    return f'<div class="strip">{items}</div>' if items else "<p>No sample grids yet.</p>"


def _evaluations(run_dir: Path) -> str:
    """The results of ``tinydit eval --out`` folders inside the run directory, if any."""
    out = []
    for path in sorted(run_dir.glob("*/metrics.json")) + sorted(run_dir.glob("*/*/metrics.json")):
        try:
            metrics = json.loads(path.read_text())
        except ValueError:
            continue
        shown = [(k, v) for k, v in metrics.items() if not isinstance(v, (dict, list))]
        shown += [(f"at guidance 1: {k}", v) for k, v in (metrics.get("guidance_1") or {}).items()]
        protocol = f"<p>Protocol: {html.escape(describe_protocol(protocol_of(metrics)))}</p>"
        out.append(f"<h3>{html.escape(str(path.parent.relative_to(run_dir)))}</h3>{protocol}{_table(shown)}")
    return "".join(out)


def _eval_protocol(records: list[dict], config: dict) -> str:
    """What the evaluations during training were measured under, as the last one recorded it (a run from
    before the record: what its config says)."""
    line = next((r["eval/protocol"] for r in reversed(records) if isinstance(r.get("eval/protocol"), str)), None)
    if line is None:
        last = next((r for r in reversed(records) if "eval/n_samples" in r), None)
        if last is None:
            return ""
        measured = {
            "data": config.get("data", {}).get("name"),
            "split": "test",  # evaluation during training scores against the test split
            **{k.removeprefix("eval/"): v for k, v in last.items() if k.startswith("eval/")},
            "precision": config.get("precision"),
        }
        line = describe_protocol(protocol_of(measured), sampling=False) + "; the checkpoint's recorded sampler"
    return f"<p>Protocol: {html.escape(line)}. Scores compare only with scores of the same protocol.</p>"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.6em; text-align: left; vertical-align: top; }
th { background: #f6f6f6; font-weight: 600; }
img.plot { max-width: 100%; }
.strip { display: flex; gap: 0.8em; overflow-x: auto; padding-bottom: 0.5em; }
.strip figure { margin: 0; text-align: center; font-size: 0.8em; }
.strip img { height: 160px; image-rendering: pixelated; }
.muted { color: #777; }
"""


def _summary(config: dict, records: list[dict], best_metric: str | None) -> list[tuple]:
    """The report's first table: what ran, how long, on what, and the step best.pt holds."""
    train, data = config.get("train", {}), config.get("data", {})
    steps = [r["step"] for r in records if "loss" in r]
    last = next((r for r in reversed(records) if "train_seconds" in r), {})
    best = next((r for r in reversed(records) if r.get("eval_best")), None)
    summary = [
        ("data", data.get("name")),
        ("model", f"{config.get('model_type')} {train.get('preset')}"),
        ("parameters", f"{config.get('params', 0):,}"),
        ("steps", steps[-1] if steps else 0),
        ("training time", f"{last.get('train_seconds', 0) / 60:.1f} min"),
        ("device, precision", f"{config.get('device')}, {config.get('precision')}"),
        ("kernels", config.get("kernels")),
        ("torch, tinydit", f"{config.get('torch_version')}, {config.get('tinydit_version')}"),
    ]
    if best is not None:
        summary.append(("best.pt", f"step {best['step']}: {best_metric} {_fmt(best.get('eval/' + str(best_metric)))}"))
    return summary


def write_run_report(run_dir: str | Path) -> Path:
    """Write ``run_dir``/report.html from what the run wrote; returns its path."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise TinyDiTError(f"{run_dir} holds no training run (no config.json); pass the `out` of `tinydit train`")
    config = json.loads(config_path.read_text())
    records = read_metrics(run_dir)
    train, data = config.get("train", {}), config.get("data", {})
    text = config.get("text")
    best_metric = next((r["best_metric"] for r in reversed(records) if "best_metric" in r), None)
    summary = _summary(config, records, best_metric)
    sections = [
        f"<h1>TinyDiT run: {html.escape(run_dir.name)}</h1>",
        f"<p class='muted'>{html.escape(str(run_dir.resolve()))}</p>",
        _table(summary),
    ]
    final = run_dir / "samples.png"
    if final.is_file():
        columns = None if text else data.get("classes")
        rows = text.get("grid_prompts") if text else None
        tile = int(config.get("model", {}).get("img_size", 32))
        sections += [
            "<h2>Samples at the end</h2>",
            f'<img class="plot" src="{_final_grid(final, columns, rows, tile)}" alt="final samples">',
        ]
    distilled = train.get("objective", train.get("few_step")) == "distill"  # older runs: few_step
    both = any(VAL_KEYS["train_t"][1] in r for r in records)  # the two validations: why they differ, said once
    notes = {
        "Loss": f"<p>{html.escape(_why_curves_differ(config))}</p>" if both else "",
        "Evaluation during training": _eval_protocol(records, config),
    }
    for title, uri in (
        ("Loss", _loss_plot(records, distilled)),
        ("Loss by t", _loss_by_t_plot(records)),
        ("Evaluation during training", _eval_plot(records, best_metric)),
    ):
        if uri is not None:
            sections += [f"<h2>{title}</h2>", f'<img class="plot" src="{uri}" alt="{title}">', notes.get(title, "")]
    sections += ["<h2>Samples over training</h2>", _strip(run_dir)]
    evaluations = _evaluations(run_dir)
    if evaluations:
        sections += ["<h2>tinydit eval</h2>", evaluations]
    sections += [
        "<h2>Configuration</h2>",
        "<h3>training</h3>",
        _table(sorted(train.items())),
        "<h3>model</h3>",
        _table(sorted(config.get("model", {}).items())),
    ]
    title = f"TinyDiT run {html.escape(run_dir.name)}"
    page = (
        f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}"
        "</style></head><body>\n" + "\n".join(sections) + "\n</body></html>\n"
    )
    path = run_dir / "report.html"
    write_text(path, page)
    return path
