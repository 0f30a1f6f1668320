"""The evaluation report: ``metrics.json`` and ``report.md`` (the exact command, the metric table and a
grid of samples, one row per class)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tinydit.eval.protocol import describe_protocol, protocol_of
from tinydit.files import write_text
from tinydit.images import from_uint8, save_grid

__all__ = ["class_grid", "headline_scores", "write_report"]

# the scores an evaluation at guidance 1 reports beside the guided one (KID's spread and the counts stay out)
HEADLINE = ("fid_", "kid_", "precision_", "recall_", "class_consistency_", "shape_", "adherence_")


def headline_scores(scores: dict) -> dict:
    """The quality scores of an evaluation's metrics: what a second set of samples at guidance 1 reports."""
    return {
        k: v for k, v in scores.items() if k.startswith(HEADLINE) and not k.endswith("_std") and isinstance(v, float)
    }


def class_grid(images: torch.Tensor, labels: torch.Tensor, n_classes: int, per_class: int = 10) -> torch.Tensor:
    """uint8 samples (N, C, S, S) -> up to ``per_class`` images of each class in class order, as one
    float batch in [-1, 1] (K, C, S, S); rows are padded with blank (white) images."""
    rows = []
    for c in range(n_classes):
        row = from_uint8(images[labels == c][:per_class])  # (k, C, S, S), k <= per_class
        blank = torch.ones(per_class - len(row), *images.shape[1:])
        rows.append(torch.cat([row, blank]))
    return torch.cat(rows)


def write_report(
    out_dir: Path,
    metrics: dict,
    command: str,
    images: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    classes: list[str] | None = None,
) -> Path:
    """Write metrics.json and report.md into ``out_dir``; ``images`` are the uint8 evaluation images."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "metrics.json", json.dumps({**metrics, "command": command}, indent=2) + "\n")
    rows = [
        f"| {k} | {v:.5g} |" if isinstance(v, float) else f"| {k} | {v} |"
        for k, v in metrics.items()
        if not isinstance(v, (dict, list))
    ]
    lines = [
        f"# TinyDiT evaluation: {metrics['data']} ({metrics['split']} split)",
        "",
        "```",
        command,
        "```",
        "",
        "| metric | value |",
        "|---|---|",
        *rows,
        "",
    ]
    # first: the numbers above compare only with numbers of the same protocol
    lines += [f"- protocol: {describe_protocol(protocol_of(metrics))}"]
    if isinstance(metrics.get("sampler"), dict):
        sampler = metrics["sampler"]
        settings = ", ".join(f"{k} {v}" for k, v in sampler.items() if v is not None and k != "source")
        lines += [f"- sampler: {settings}" + (f" ({sampler['source']})" if sampler.get("source") else "")]
    if metrics.get("guidance_1"):  # the model alone, beside the guided samples' scores above
        plain = metrics["guidance_1"]
        scores = ", ".join(f"{k} {v:.4g}" for k, v in plain.items() if k != "nfe_per_image")
        lines += [
            f"- at guidance 1 (the same noise, no guidance, {plain['nfe_per_image']} evaluations per image): {scores}"
        ]
    for name, net in metrics.get("feature_nets", {}).items():
        what = "standard FID Inception" if name == "inception" else "offline feature network, not Inception"
        acc = f", test accuracy {net['test_accuracy']}" if net.get("test_accuracy") is not None else ""
        lines.append(f"- `{name}`: {what} (weights `{str(net['sha256'])[:16]}`{acc})")
    if images is not None and labels is not None and classes:
        grid = class_grid(images, torch.as_tensor(np.asarray(labels)), len(classes))
        save_grid(grid, out_dir / "samples_by_class.png", nrow=10)
        lines += ["", f"Samples, one row per class ({', '.join(classes)}):", "", "![samples](samples_by_class.png)"]
    path = out_dir / "report.md"
    write_text(path, "\n".join(lines) + "\n")
    return path
