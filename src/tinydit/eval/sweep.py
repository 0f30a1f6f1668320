"""``tinydit sweep``: sample quality against the number of model evaluations, for one checkpoint.

For every combination of sampler, step count (for the adaptive ``dopri5``: tolerance, rtol = atol,
instead) and guidance scale, the same N class-balanced samples (same labels, same seed, so the same
noise) are generated and scored with the offline metrics of ``tinydit.eval.evaluate``. The output folder
holds

    sweep.csv    one row per combination: settings, model evaluations per image (nfe), metrics, time
    sweep.md     the same table, the command and the settings
    sweep.json   the settings and every metric of every row
    sweep.png    FID against nfe (log scale), one line per sampler and guidance scale

and is rewritten after each combination. Re-running the same command continues a sweep: rows already
in ``sweep.json`` for the same checkpoint (and step) and settings are kept, not recomputed (a sweep.json of
an older format, ``SWEEP_FORMAT``, is sampled again).
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
import sys
import time
from pathlib import Path

import torch

from tinydit.checkpoints.checkpoint import load_model
from tinydit.errors import TinyDiTError
from tinydit.eval.evaluate import DEFAULT_CACHE, EvalSpec, evaluate, spec_for
from tinydit.eval.metrics import MIN_SAMPLES
from tinydit.eval.plot import MARKERS, line_plot
from tinydit.eval.protocol import describe_protocol, protocol_of
from tinydit.eval.sampling import EvalTarget, eval_conditions
from tinydit.files import ensure_writable_dir, write_text
from tinydit.flow.generate import generate
from tinydit.flow.samplers import SAMPLER_NAMES
from tinydit.flow.settings import SamplingSettings
from tinydit.progress import Progress

__all__ = [
    "sweep_points",
    "check_sweep",
    "run_sweep",
    "write_sweep",
    "sweep_rows",
    "best_setting",
    "DOPRI5_FIRST_STEPS",
]

DOPRI5_FIRST_STEPS = 16  # dopri5's first trial step is 1/16; it adapts from there
# in sweep.json's settings: rows of an older sweep.json (another format) are sampled again, not reused
SWEEP_FORMAT = 2
# the table's columns; {net} stands for the feature network's name, as in `tinydit eval`'s metrics
COLUMNS = (
    "sampler",
    "steps",
    "tol",
    "cfg_scale",
    "nfe",
    "fid_{net}",
    "kid_{net}_mean",
    "precision_{net}",
    "recall_{net}",
    "class_consistency_{net}",
    "sample_seconds",
)


def sweep_points(samplers: list[str], steps: list[int], cfg_scales: list[float], tols: list[float]) -> list[dict]:
    """The combinations, in table order: {sampler, steps, tol, cfg_scale}; dopri5 runs over ``tols`` instead of
    steps."""
    if any(not (math.isfinite(tol) and tol > 0) for tol in tols):
        raise TinyDiTError(f"`tols` must be positive numbers such as 1e-2,1e-3, got {','.join(map(str, tols))}")
    points = []
    for name in dict.fromkeys(samplers):  # in the given order, each once
        if name not in SAMPLER_NAMES:
            raise TinyDiTError(f"unknown sampler {name!r} in `samplers`: use some of {', '.join(SAMPLER_NAMES)}")
        for scale in dict.fromkeys(cfg_scales):
            if name == "dopri5":
                points += [
                    {"sampler": name, "steps": None, "tol": tol, "cfg_scale": scale} for tol in dict.fromkeys(tols)
                ]
            else:
                points += [{"sampler": name, "steps": s, "tol": None, "cfg_scale": scale} for s in dict.fromkeys(steps)]
    return points


def _settings_of(point: dict, grid: dict) -> SamplingSettings:
    """The sampler settings of one combination on the sweep's ``grid`` (grid, shift, cfg_interval), checked."""
    steps = DOPRI5_FIRST_STEPS if point["steps"] is None else point["steps"]  # 0 is refused, not replaced
    return SamplingSettings(
        point["sampler"], steps, point["cfg_scale"], **grid, rtol=point["tol"], atol=point["tol"], source="a sweep"
    )


def check_sweep(
    samplers: list[str],
    steps: list[int],
    cfg_scales: list[float],
    tols: list[float] = (1e-2, 1e-3),
    n: int = 1000,
    batch_size: int = 256,
    grid: str = "uniform",
    shift: float | None = None,
    cfg_interval: tuple[float, float] | None = None,
) -> tuple[list[dict], dict[str, SamplingSettings]]:
    """The combinations and each one's settings by its key, every setting and the sample count checked, before
    anything is loaded or drawn (``tinydit.api.sweep`` checks them before it locks a checkpoint to record in)."""
    options = {"grid": "uniform" if grid is None else grid, "shift": shift, "cfg_interval": cfg_interval}
    points = sweep_points(samplers, steps, cfg_scales, tols)
    return points, _checked_settings(points, options, n, batch_size)


def run_sweep(
    checkpoint: str | Path,
    out: str | Path,
    samplers: list[str],
    steps: list[int],
    cfg_scales: list[float],
    tols: list[float] = (1e-2, 1e-3),
    n: int = 1000,
    seed: int = 0,
    device: torch.device | str = "cpu",
    grid: str = "uniform",
    shift: float | None = None,
    cfg_interval: tuple[float, float] | None = None,
    split: str = "test",
    root: str | Path = "data",
    cache_dir: str | Path | None = DEFAULT_CACHE,
    batch_size: int = 256,
    ema: bool = True,
    progress: bool = True,
    command: str | None = None,
) -> list[dict]:
    """Generate and score every combination (see the module docstring); returns the rows."""
    grid = "uniform" if grid is None else grid
    options = {"grid": grid, "shift": shift, "cfg_interval": cfg_interval}
    points, settings_of = check_sweep(samplers, steps, cfg_scales, tols, n, batch_size, **options)
    out = Path(out)
    model, state = load_model(checkpoint, ema=ema, map_location=device)
    data = state.data.name
    spec = spec_for(data)  # the reference, for every row
    if spec.feature_net is None:
        raise TinyDiTError(
            f"{checkpoint} was trained on {data}, which has no offline feature network; "
            "tinydit sweep scores with the offline metrics (fashion-mnist and shapes)"
        )
    ensure_writable_dir(out)  # only once the inputs are known good
    settings = {"checkpoint": str(Path(checkpoint).resolve()), "checkpoint_step": state.step, "ema": ema}
    settings |= {"data": data, "split": split, "n": n, "seed": seed, **options, "format": SWEEP_FORMAT}
    settings["cfg_interval"] = list(cfg_interval) if cfg_interval is not None else None  # as JSON reads it back
    done = _previous_rows(out / "sweep.json", settings)
    reused = sum(json.dumps(p, sort_keys=True) in done for p in points)
    if reused:
        print(f"continuing the sweep in {out}: {reused} of {len(points)} settings are done", file=sys.stderr)
    y, labels, _ = eval_conditions(EvalTarget.of_checkpoint(state), n)  # labels, or prompts for a text model
    rows: list[dict] = []
    bar = Progress(len(points), "sweep", unit="setting", enabled=progress)
    for point in points:
        key = json.dumps(point, sort_keys=True)
        bar.set(
            at=f"{point['sampler']} steps {point['steps'] or '-'} tol {point['tol'] or '-'} cfg {point['cfg_scale']:g}"
        )
        if key in done:
            rows.append(done[key])
            bar.update()
            continue
        rows.append(
            _score_point(model, y, labels, point, settings_of[key], seed, batch_size, spec, split, root, cache_dir)
        )
        write_sweep(out, settings, rows, command)
        bar.update()
    bar.close()
    write_sweep(out, settings, rows, command)
    return rows


def _score_point(
    model,
    y,
    labels,
    point: dict,
    settings: SamplingSettings,
    seed: int,
    batch_size: int,
    spec: EvalSpec,
    split: str,
    root,
    cache_dir,
) -> dict:
    """One row of the sweep: ``point``'s samples (drawn with its ``settings``) scored with the offline metrics."""
    started = time.perf_counter()
    res = generate(model, y, settings, seed, batch_size)
    seconds = time.perf_counter() - started
    # a setting is chosen by the headline network's FID (or the strict judge): the independent one stays out
    metrics = evaluate(res.x, labels, spec, split=split, root=root, cache_dir=cache_dir, independent=False)
    scores = {k: v for k, v in metrics.items() if not isinstance(v, dict)}
    return {
        **point,
        "nfe": res.nfe,
        **scores,
        "sample_seconds": seconds,
        "feature_net": next(iter(metrics["feature_nets"])),
        "sampler_settings": settings.filled().to_json(),
    }


def _checked_settings(points: list[dict], grid: dict, n: int, batch_size: int) -> dict[str, SamplingSettings]:
    """Each point's settings by its key, once every setting and the sample count are checked, before the
    first sample is drawn."""
    settings = {json.dumps(p, sort_keys=True): _settings_of(p, grid) for p in points}
    if batch_size < 1:
        raise TinyDiTError(f"`batch_size` must be >= 1, got {batch_size}")
    if n < MIN_SAMPLES:
        raise TinyDiTError(
            f"`n` {n} is too few samples to score; give at least {MIN_SAMPLES} (1000 or more "
            "for FIDs that differ by more than their noise)"
        )
    return settings


def _previous_rows(path: Path, settings: dict) -> dict[str, dict]:
    """Rows of an earlier run of the same sweep, keyed by their combination; none if anything differs."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if old.get("settings") != settings:
        return {}
    return {
        json.dumps({k: r[k] for k in ("sampler", "steps", "tol", "cfg_scale")}, sort_keys=True): r
        for r in old.get("rows", [])
    }


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _sweep_protocol(settings: dict, rows: list[dict]) -> str:
    """The protocol every row of the sweep shares: feature network, reference, sample count, precision."""
    first = rows[0] if rows else {}
    shared = {
        "feature_net": first.get("feature_net") or spec_for(settings["data"]).feature_net,
        "data": settings["data"],
        "split": settings["split"],
        "n_reference": first.get("n_reference"),
        "n_samples": settings["n"],
        "precision": "fp32",  # a sweep samples in fp32 on every device, as `tinydit eval` does
    }
    return describe_protocol(protocol_of(shared), sampling=False)


def write_sweep(out: Path, settings: dict, rows: list[dict], command: str | None = None) -> None:
    """sweep.json, sweep.csv, sweep.md and sweep.png from the rows so far."""
    net = rows[0]["feature_net"] if rows else spec_for(settings["data"]).feature_net
    columns, fid = [c.format(net=net) for c in COLUMNS], f"fid_{net}"
    write_text(
        out / "sweep.json", json.dumps({"settings": settings, "command": command, "rows": rows}, indent=2) + "\n"
    )
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([["" if r.get(c) is None else r.get(c) for c in columns] for r in rows])
    write_text(out / "sweep.csv", buf.getvalue())
    shown = ", ".join(f"{k} {v}" for k, v in settings.items() if v is not None)
    lines = [
        "# TinyDiT sampler sweep",
        "",
        *(["```", command, "```", ""] if command else []),
        shown,
        "",
        f"Every row: {_sweep_protocol(settings, rows)}; its sampler, guidance and evaluations per image in its "
        "columns. FIDs compare only under the same protocol (`tinydit.eval.protocol`).",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows),
        "",
        "nfe: model evaluations per image (a guided velocity costs 2); tol: dopri5's rtol = atol.",
        "",
        f"![{fid} against nfe](sweep.png)",
    ]
    write_text(out / "sweep.md", "\n".join(lines) + "\n")
    series, markers = [], []
    for name in dict.fromkeys(r["sampler"] for r in rows):
        for scale in dict.fromkeys(r["cfg_scale"] for r in rows if r["sampler"] == name):
            # by nfe: with a guidance interval more steps can cost fewer evaluations (11 steps: 20, 10: 21)
            sel = sorted((r for r in rows if r["sampler"] == name and r["cfg_scale"] == scale), key=lambda r: r["nfe"])
            series.append((f"{name}, cfg {scale:g}", [r["nfe"] for r in sel], [r[fid] for r in sel]))
            markers.append(MARKERS[SAMPLER_NAMES.index(name) % len(MARKERS)])
    line_plot(
        series,
        out / "sweep.png",
        markers=markers,
        xlabel="model evaluations per image",
        ylabel=fid,
        title=f"{settings['data']} ({settings['split']} split), n = {settings['n']}: {fid} against model evaluations",
    )


def sweep_rows(out: str | Path) -> list[dict]:
    """The rows a sweep wrote into ``out`` (sweep.json)."""
    return json.loads((Path(out) / "sweep.json").read_text())["rows"]


def best_setting(rows: list[dict], max_nfe: float, n: int, seed: int) -> SamplingSettings:
    """The settings of the sweep row with the lowest FID within ``max_nfe`` model evaluations per image, with a
    source that says so (what ``--apply`` records)."""
    within = [r for r in rows if r["nfe"] <= max_nfe]
    if not within:
        raise TinyDiTError(
            f"no swept setting takes at most {max_nfe:g} evaluations per image (the fewest took "
            f"{min(r['nfe'] for r in rows):g}); raise `max_nfe` or sweep fewer steps"
        )
    fid = f"fid_{within[0]['feature_net']}"
    best = min(within, key=lambda r: r[fid])
    source = (
        f"tinydit sweep --apply, {datetime.date.today().isoformat()}: {fid} {best[fid]:.4g} with "
        f"{best['nfe']:g} evaluations per image ({n} samples, seed {seed}), the best of {len(within)} "
        f"settings within {max_nfe:g}"
    )
    return SamplingSettings.from_json({**best["sampler_settings"], "source": source})
