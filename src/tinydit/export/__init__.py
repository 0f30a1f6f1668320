"""``tinydit export``: a checkpoint's EMA velocity model v(x, t, y) as a file that runs without TinyDiT.

    onnx   model.onnx through torch.onnx.export (the dynamo exporter; the ``export`` extra: onnx, onnxscript)
    pt2    a torch.export program (torch.export.save), loaded with torch.export.load
    web    a folder with index.html, model.onnx, a JavaScript sampler and onnxruntime-web (from its npm
           package, copied in): open it with ``python -m http.server`` and sample in the browser
    safetensors  a pretrained folder (``tinydit.checkpoints.pretrained``): model.safetensors, config.json and a
           model card, the Hugging Face Hub's layout; every command's --checkpoint and
           ``tinydit.from_pretrained`` read it back

Every format has a dynamic batch (guidance's two halves run in one call) and carries what a sampler
needs as JSON (``tinydit``: in the ONNX model's metadata, in the .pt2's extra files, and as the web
folder's model.json): the image shape, the classes or the tokenizer, the time convention, and the
sampler settings the run's sample grids used. ``tinydit.export.ort_sampler`` samples a model.onnx with
numpy and onnxruntime alone.

TorchScript is left out: torch.export is its successor in torch 2.x, and ONNX covers the runtimes
without Python.
"""

from __future__ import annotations

import io
import json
import shutil
import warnings
from pathlib import Path

import torch
from torch import nn

from tinydit.checkpoints import pretrained
from tinydit.checkpoints.checkpoint import Checkpoint, load_checkpoint, load_model
from tinydit.data.text import tokenizer_of
from tinydit.errors import TinyDiTError
from tinydit.files import atomic_write, ensure_writable_dir, read_lines, write_text
from tinydit.models.attention import ATTENTION
from tinydit.models.dit import X_PRED_T_MIN
from tinydit.models.linear import LINEAR
from tinydit.paths import check_out, read_paths

__all__ = ["FORMATS", "export", "metadata", "find_ort_web"]

FORMATS = ("onnx", "pt2", "web", "safetensors")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # safetensors weights
WEB = Path(__file__).parent / "web"  # index.html and sampler.js
# What the exported samplers (ort_sampler.py, the page's sampler.js, each standalone with its own copy) run in
# place of a recorded sampler with adaptive steps: a fixed-step one, with the recorded steps.
STAND_IN = {"dopri5": "heun"}
# The CPU (WebAssembly) build of onnxruntime-web: its script and the module and binary it loads.
ORT_WEB_FILES = ("ort.wasm.min.js", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")


class _Velocity(nn.Module):
    """The model with its inputs named and typed for export: (x, t, y[, d]) -> v."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, d: torch.Tensor | None = None):
        return self.model(x, t, y) if d is None else self.model(x, t, y, d)


def metadata(state: Checkpoint, model: nn.Module) -> dict:
    """What a sampler of the exported model needs to know, as plain JSON."""
    c, tok = model.config, tokenizer_of(state)
    return {
        "format": "tinydit-export",
        "version": 1,
        "image": {"channels": c.in_channels, "size": c.img_size},
        "cond": c.cond,
        "classes": list(state.data.classes),
        "n_classes": c.n_classes,
        "tokenizer": tok.to_dict() if tok is not None else None,
        "prompts": list(state.data.prompts) if state.data.prompts is not None else None,
        "shortcut": bool(c.shortcut),
        "time": "t = 0 is data, t = 1 is Gaussian noise; x_t = (1 - t) x0 + t noise; the model returns v = dx/dt",
        "null": "the label n_classes" if c.cond == "class" else "the empty caption: BOS (1), then PAD (0)",
        # x-prediction: v = (x - x0) / max(t, x_pred_t_min); the samplers use (x - x0) / t below it, t > 0
        "x_pred_t_min": X_PRED_T_MIN if getattr(c, "pred", "v") == "x" else None,
        "sampler": state.sampling_settings().to_json(),
        "data": state.data.name,
        "step": state.step,
    }


def _example(model: nn.Module, n: int = 2):
    c = model.config
    x = torch.randn(n, c.in_channels, c.img_size, c.img_size)
    y = torch.arange(n) % c.n_classes if c.cond == "class" else torch.full((n, c.text_len), 3, dtype=torch.long)
    args = (x, torch.rand(n), y) + ((torch.zeros(n),) if c.shortcut else ())
    batch = torch.export.Dim("batch", min=1, max=65536)
    return args, tuple({0: batch} for _ in args)


def _onnx(model: nn.Module, meta: dict, path: Path) -> Path:
    try:
        import onnx  # noqa: F401  (the exporter needs onnx and onnxscript)
        import onnxscript  # noqa: F401
    except ImportError as err:
        raise TinyDiTError("`format` onnx needs onnx and onnxscript: pip install 'tinydit[export]'") from err
    args, dynamic = _example(model)
    names = ["x", "t", "y", "d"][: len(args)]
    with warnings.catch_warnings():  # the exporter reports its own progress as warnings
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            _Velocity(model),
            args,
            dynamo=True,
            input_names=names,
            output_names=["v"],
            dynamic_shapes=dynamic,
            verbose=False,
        )
    proto = program.model_proto
    entry = proto.metadata_props.add()
    entry.key, entry.value = "tinydit", json.dumps(meta)
    with atomic_write(path) as f:
        f.write(proto.SerializeToString())
    return path


def _pt2(model: nn.Module, meta: dict, path: Path) -> Path:
    args, dynamic = _example(model)
    program = torch.export.export(_Velocity(model), args, dynamic_shapes=dynamic)
    buf = io.BytesIO()
    torch.export.save(program, buf, extra_files={"tinydit.json": json.dumps(meta)})
    with atomic_write(path) as f:
        f.write(buf.getbuffer())
    return path


def find_ort_web(hint: str | Path | None = None) -> Path:
    """The dist folder of the npm package onnxruntime-web: ``hint``, else node_modules/ here or above."""
    candidates = (
        [Path(hint)]
        if hint
        else [p / "node_modules" / "onnxruntime-web" / "dist" for p in (Path.cwd(), *Path.cwd().parents)]
    )
    for c in candidates:
        if all((c / f).is_file() for f in ORT_WEB_FILES):
            return c
    where = hint or "node_modules/onnxruntime-web/dist here or in a folder above"
    raise TinyDiTError(
        f"`format` web copies onnxruntime-web into the page, and {where} has not got it: run "
        "`npm install onnxruntime-web` (or pass `ort_web` DIR, the package's dist folder)"
    )


def _web(model: nn.Module, meta: dict, folder: Path, ort_web: str | Path | None) -> Path:
    dist = find_ort_web(ort_web)  # before anything is written
    ensure_writable_dir(folder)
    _onnx(model, meta, folder / "model.onnx")
    write_text(folder / "model.json", json.dumps(meta, indent=1) + "\n")
    for name in ("index.html", "sampler.js"):
        write_text(folder / name, (WEB / name).read_text())
    for name in ORT_WEB_FILES:
        shutil.copyfile(dist / name, folder / name)
    return folder


def run_metrics(checkpoint: str | Path, step: int) -> dict | None:
    """The metrics of the evaluation at ``step`` in the metrics.jsonl beside a run's checkpoint (``--eval-every``),
    or None: what a model card shows unless it is given an evaluation's metrics.json."""
    records = read_lines(Path(checkpoint).parent / "metrics.jsonl") if Path(checkpoint).is_file() else []
    found = None
    for record in records:
        if record.get("step") == step and any(k.startswith("eval/") for k in record):
            found = {k.removeprefix("eval/"): v for k, v in record.items() if k.startswith("eval/")}
    return found


def read_eval_metrics(path: str | Path) -> dict:
    """An evaluation's metrics.json (``tinydit eval --out DIR``) as a dict of numbers."""
    try:
        metrics = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise TinyDiTError(
            f"`metrics` {path} is not readable JSON ({type(err).__name__}); pass the metrics.json "
            "that `tinydit eval --out DIR` writes"
        ) from err
    if not isinstance(metrics, dict):
        raise TinyDiTError(f"`metrics` {path} holds no metrics; pass the metrics.json that `tinydit eval` writes")
    return metrics


def export(
    checkpoint: str | Path,
    fmt: str,
    out: str | Path,
    ema: bool = True,
    ort_web: str | Path | None = None,
    dtype: str = "float32",
    metrics: str | Path | None = None,
    about: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Export the checkpoint's (EMA) model as ``fmt`` (onnx, pt2, web or safetensors) to ``out``; returns the path.
    ``out`` is a new file or folder (an empty folder for the folder formats), or an earlier export of the same
    format with ``overwrite``; never what the export reads, a run directory or a shipped model (``tinydit.paths``).

    safetensors only: ``dtype`` of the weights (float32, bfloat16 or float16), ``metrics``, an evaluation's
    metrics.json for the model card (else the run's own evaluation at the checkpoint's step, if any), and
    ``about``, a line for the card (how and where the model was trained)."""
    if fmt not in FORMATS:
        raise TinyDiTError(f"unknown `format` {fmt!r}: use one of {', '.join(FORMATS)}")
    out = Path(out)
    if fmt not in ("web", "safetensors") and out.suffix != f".{fmt}":
        raise TinyDiTError(f"`out` {out}: a {fmt} export is a file ending in .{fmt}")
    if fmt == "safetensors" and (out.is_file() or out.suffix in (".safetensors", ".pt", ".pt2", ".onnx", ".json")):
        raise TinyDiTError(
            f"`out` {out}: a safetensors export is a folder (model.safetensors, config.json, "
            "README.md); give the folder's name"
        )
    if fmt == "safetensors" and dtype not in DTYPES:
        raise TinyDiTError(f"`dtype` must be one of {', '.join(DTYPES)}, got {dtype!r}")
    writes = {"safetensors": "pretrained folder", "web": "web export"}.get(fmt, "file")
    check_out(out, writes, read_paths(checkpoint, metrics, ort_web), overwrite=overwrite)  # before anything is read
    if fmt == "safetensors":
        state = load_checkpoint(checkpoint)  # its weights checked against its config as it is read
        shown = read_eval_metrics(metrics) if metrics is not None else run_metrics(checkpoint, state.step)
        record = state.to_dict() | {"sampling": state.sampling_settings().to_json()}  # as sample would
        ema = ema and state.ema is not None
        weights = state.weights(ema)
        return pretrained.save_pretrained(
            record, weights, out, ema=ema, dtype=DTYPES[dtype], metrics=shown, about=about
        )
    model, state = load_model(checkpoint, ema=ema)
    meta = metadata(state, model)
    recorded = meta["sampler"]["sampler"]
    if fmt in ("onnx", "web") and recorded in STAND_IN:  # their samplers (ort_sampler, the page) take fixed steps
        warnings.warn(
            f"the checkpoint records the {recorded} sampler, whose adaptive steps the exported samplers do not "
            f"take: they run {STAND_IN[recorded]} with its steps, guidance and interval instead",
            stacklevel=2,
        )
    # The portable kernels: plain matmuls (the oneDNN linear is an opaque custom operator) and attention
    # written out, which every runtime has.
    with LINEAR.use("blas"), ATTENTION.use("matmul"), torch.no_grad():
        if fmt == "web":
            return _web(model, meta, out, ort_web)
        ensure_writable_dir(out.parent)
        return _onnx(model, meta, out) if fmt == "onnx" else _pt2(model, meta, out)
