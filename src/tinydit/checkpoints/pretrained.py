"""Pretrained folders: a model's weights in safetensors beside a JSON config (the Hugging Face Hub's layout).

    FOLDER/
        model.safetensors   the weights the commands sample with (a run's EMA), no optimizer state
        config.json         the model type and config, the data (name, classes, channels, size), the tokenizer
                            of a text model, the time convention, the recorded sampler settings with their
                            source, and how the model was trained
        README.md           a model card: what the model is, how it was trained, its measured metrics, and
                            the commands that sample and measure it

``save_pretrained`` writes one from a training checkpoint (``tinydit export --format safetensors``);
``load_pretrained`` reads it back as the same dict a checkpoint holds, without optimizer state, so
``tinydit.checkpoints.checkpoint.load_checkpoint`` (and with it every command's ``--checkpoint``) takes a folder.
Reading never unpickles: only safetensors and JSON are read.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from tinydit.errors import TinyDiTError
from tinydit.files import atomic_write, ensure_writable_dir, write_text
from tinydit.paths import SHIPPED
from tinydit.schema import check_fields, check_text, check_value, reading
from tinydit.version import __version__

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "WEIGHTS",
    "CONFIG",
    "CARD",
    "TIME_CONVENTION",
    "save_pretrained",
    "load_pretrained",
    "pretrained_config",
    "model_card",
    "resolve_folder",
    "is_hub_id",
    "reference_models",
    "reference_folder",
    "parameter_count",
    "rewrite_sampling",
]

FORMAT = "tinydit-pretrained"
FORMAT_VERSION = 1
WEIGHTS, CONFIG, CARD = "model.safetensors", "config.json", "README.md"
TIME_CONVENTION = "t = 0 is data, t = 1 is Gaussian noise; x_t = (1 - t) x0 + t noise; the model returns v = dx/dt"
# What a folder keeps of a checkpoint, besides the weights: everything sampling and evaluation read.
KEPT = (
    "model_type",
    "model_config",
    "train_config",
    "data",
    "tokenizer",
    "sampling",
    "step",
    "train_seconds",
    "kernels",
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name
# Reference models shipped in the package (``tinydit sample --pretrained NAME``), each a pretrained folder
# trained by the documented command; its model card says which, on what machine, and what it measures.
# No command writes there (``tinydit.paths``): scripts/make_reference.py copies a new one in.
REFERENCE = SHIPPED


def reference_models() -> list[str]:
    """The names of the reference models this installation ships."""
    return sorted(p.name for p in REFERENCE.iterdir() if (p / CONFIG).is_file()) if REFERENCE.is_dir() else []


def reference_folder(name: str) -> Path:
    """The folder of the reference model called ``name``."""
    names = reference_models()
    check_text(name, "pretrained", f"the name of a model shipped with tinydit ({', '.join(names) or 'none'})")
    if name not in names:
        raise TinyDiTError(
            f"unknown `pretrained` model {name!r}: this tinydit ships {', '.join(names) or 'none'}; "
            "or pass your own folder or checkpoint with `checkpoint`"
        )
    return REFERENCE / name


def pretrained_config(record: dict) -> dict:
    """The config.json of a checkpoint's ``record`` (``Checkpoint.to_dict``): ``KEPT`` of it and the format,
    version and time convention."""
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tinydit_version": __version__,
        "time": TIME_CONVENTION,
    }
    config.update({k: record.get(k) for k in KEPT})
    return config


def save_pretrained(
    record: dict,
    weights: dict,
    folder: str | Path,
    ema: bool = True,
    dtype: torch.dtype | None = None,
    metrics: dict | None = None,
    about: str | None = None,
) -> Path:
    """Write a checkpoint's ``record`` (``tinydit.checkpoints.checkpoint.Checkpoint.to_dict``) and ``weights`` (its
    EMA weights where ``ema``) as a pretrained folder: the weights in ``dtype`` (None: as trained, fp32),
    config.json and a model card that shows ``metrics`` (an evaluation's metrics.json, or None) and ``about``
    (a line: the command and machine it was trained with). Returns the folder."""
    tensors = {
        k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().cpu().contiguous()
        for k, v in weights.items()
    }
    folder = Path(folder)
    ensure_writable_dir(folder)
    config = pretrained_config(record)
    config["about"] = about
    config["metrics"] = metrics
    config["weights"] = {"ema": bool(ema), "dtype": str(next(iter(tensors.values())).dtype).removeprefix("torch.")}
    from safetensors.torch import save

    with atomic_write(folder / WEIGHTS) as f:
        f.write(save(tensors, metadata={"format": "pt"}))
    write_text(folder / CONFIG, json.dumps(config, indent=1) + "\n")
    write_text(folder / CARD, model_card(config, sum(t.numel() for t in tensors.values())))
    return folder


def is_hub_id(text: str) -> bool:
    """Whether ``text`` reads as a Hugging Face Hub model id, owner/name."""
    return bool(_HUB_ID.match(text))


def resolve_folder(path: str | Path) -> Path:
    """A local pretrained folder for ``path``: the folder itself, the folder of its config.json or
    model.safetensors, or for a Hub id (owner/name) that is not a local path, its download (needs
    ``huggingface_hub`` and a network)."""
    path = Path(path)
    if path.is_file() and path.name in (CONFIG, WEIGHTS):
        return path.parent
    if path.exists() or not is_hub_id(str(path)):
        return path
    missing = f"{path} does not exist: pass a checkpoint.pt, a run directory or a pretrained folder"
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:
        raise TinyDiTError(f"{missing} (to fetch a Hugging Face Hub id, install huggingface_hub)") from err
    try:
        return Path(snapshot_download(str(path), allow_patterns=[WEIGHTS, CONFIG, CARD]))
    except Exception as err:  # no network, no such repository, no access: one line that says so
        first = str(err).splitlines()[0] if str(err) else ""
        raise TinyDiTError(
            f"{missing}; as a Hugging Face Hub id it could not be fetched either ({type(err).__name__}: {first})"
        ) from err


@dataclass(frozen=True)
class FolderConfig:
    """The keys of a folder's config.json and their types, which ``load_pretrained`` checks as it reads the file
    (``tinydit.schema``). The records among them (model_config, data, train_config, tokenizer, sampling) become
    a checkpoint's and are checked in full, against each other and the weights, by its reader
    (``tinydit.checkpoints.checkpoint.Checkpoint.from_dict``). A key not listed here is left alone, as a checkpoint
    keeps the keys it does not know: a newer release may add a note, but never a key that changes the model."""

    format: str
    format_version: int
    model_config: dict
    data: dict
    tinydit_version: str | None = None
    time: str | None = None  # TIME_CONVENTION, for a reader without TinyDiT
    model_type: str | None = None  # None: a DiT, as before MMDiT existed
    train_config: dict | None = None
    tokenizer: dict | None = None
    sampling: dict | None = None
    step: int | None = None
    train_seconds: float | None = None
    kernels: dict | None = None
    about: str | None = None  # the model card's line on how it was trained
    metrics: dict | None = None  # the model card's metrics
    weights: dict | None = None  # {"ema": whether they are the EMA's, "dtype": the type of every float tensor}
    check: dict | None = None  # a shipped model's check, drawn again by tests/test_reference.py


def load_pretrained(folder: str | Path) -> dict:
    """A pretrained folder as a checkpoint dict (``model`` and ``ema`` both the folder's weights, ``source``
    the weights' file); a clear ``TinyDiTError`` naming the file and the fix for anything else."""
    folder = resolve_folder(folder)
    config_path, weights_path = folder / CONFIG, folder / WEIGHTS
    hint = (
        "a pretrained folder holds config.json and model.safetensors, written by `tinydit export --format safetensors`"
    )
    if not config_path.is_file():
        raise TinyDiTError(f"{folder} has no {CONFIG}: {hint}")
    if not weights_path.is_file():
        raise TinyDiTError(f"{folder} has no {WEIGHTS}: {hint}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TinyDiTError(
            f"{config_path} is not readable JSON ({type(err).__name__}): export the folder again"
        ) from err
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise TinyDiTError(f"{config_path} is not a TinyDiT pretrained config (its format must be {FORMAT!r}): {hint}")
    if config.get("format_version") != FORMAT_VERSION:
        raise TinyDiTError(
            f"{config_path} has format version {config.get('format_version')}, this tinydit "
            f"{__version__} reads version {FORMAT_VERSION}; use the tinydit release that wrote it"
        )
    missing = [k for k in ("model_config", "data") if k not in config]
    if missing:
        raise TinyDiTError(f"{config_path} lacks {', '.join(missing)}: export the folder again")
    with reading(str(config_path), "fix it, or export the folder again"):
        config |= check_fields(FolderConfig, config, "")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        weights = load_file(weights_path)
    except (SafetensorError, OSError, ValueError) as err:
        raise TinyDiTError(
            f"{weights_path} is not a readable safetensors file ({type(err).__name__}): export the folder again"
        ) from err
    with reading(str(config_path), "fix it, or export the folder again"):
        _check_weights_record(config.get("weights"), weights)
    state = {k: config.get(k) for k in KEPT}
    state.update(
        format=FORMAT,
        model_type=config.get("model_type"),
        model=weights,
        ema=weights,
        train_config=config.get("train_config") or {},
        step=config.get("step") or 0,  # a config.json written by hand may leave it out
        source=str(weights_path),
    )
    return state


def _check_weights_record(record: dict | None, weights: dict) -> None:
    """config.json's ``weights`` against the tensors: what the model card says of them must be so."""
    if record is None:
        return
    if not set(record) <= {"ema", "dtype"}:
        raise TinyDiTError(f"weights holds unknown keys {', '.join(sorted(set(record) - {'ema', 'dtype'}))}")
    check_value(record.get("ema", True), bool, "weights.ema")
    dtype = check_value(record.get("dtype", "float32"), str, "weights.dtype")
    found = sorted({str(t.dtype).removeprefix("torch.") for t in weights.values() if t.is_floating_point()})
    if found and found != [dtype]:
        raise TinyDiTError(f"weights.dtype says {dtype!r}, and {WEIGHTS} holds {', '.join(found)} tensors")


def parameter_count(weights: str | Path) -> int:
    """The number of parameters a model.safetensors holds, from its header alone."""
    from safetensors import safe_open

    with safe_open(weights, "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def rewrite_sampling(folder: str | Path, sampling: dict) -> None:
    """Record ``sampling`` (``tinydit.flow.settings.SamplingSettings.to_json``) as a pretrained folder's sampler
    settings, in the folder's own format: config.json's ``sampling`` and the model card that shows them are
    written again, everything else in them as it was; model.safetensors is not touched."""
    folder = Path(folder)
    config = json.loads((folder / CONFIG).read_text())
    config["sampling"] = sampling
    write_text(folder / CONFIG, json.dumps(config, indent=1) + "\n")
    write_text(folder / CARD, model_card(config, parameter_count(folder / WEIGHTS)))


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def model_card(config: dict, n_params: int) -> str:
    """The README.md of a pretrained folder, from its config.json (its ``metrics`` and ``about`` included) and
    its parameter count."""
    metrics = config.get("metrics")
    train, data, model = config.get("train_config") or {}, config.get("data") or {}, config.get("model_config") or {}
    name = train.get("preset") or config.get("model_type", "dit")
    sampling, text = config.get("sampling") or {}, model.get("cond") == "text"
    kind = {"dit": "DiT", "mmdit": "MMDiT"}.get(config.get("model_type", "dit"), config.get("model_type"))
    drawn = '--prompt "a red circle on a blue background" --n 8' if text else "--n 64"
    budget = f"{train['minutes']:g} minutes" if train.get("minutes") else f"{train.get('steps')} steps"
    minutes = (config.get("train_seconds") or 0) / 60
    lines = [
        f"# TinyDiT {name} on {data.get('name', '?')}",
        "",
        f"A flow-matching {kind} ({n_params:,} parameters) that draws "
        f"{data.get('channels', '?')}x{data.get('img_size', '?')}x{data.get('img_size', '?')} images of "
        f"{data.get('name', '?')}, conditioned on "
        + ("a caption." if text else f"a class ({', '.join(data.get('classes') or [])})."),
        "",
        "## Use",
        "",
        "```bash",
        "pip install -e .   # in a clone of the TinyDiT repository",
        f"tinydit sample --checkpoint THIS_FOLDER {drawn} --out samples.png",
        "```",
        "",
        "```python",
        "import tinydit",
        "",  # as a formatter writes it: the card's code is checked like the package's
        f'model = tinydit.from_pretrained("THIS_FOLDER")  # the {kind}, in eval mode; or api.sample("THIS_FOLDER")',
        "```",
        "",
        f"Time convention: {config.get('time', TIME_CONVENTION)}.",
        "",
        "## Training",
        "",
        "| | |",
        "|---|---|",
        f"| data | {data.get('name', '?')} |",
        f"| preset | {name} |",
        f"| budget | {budget}; {config.get('step')} optimizer steps in {minutes:.1f} training minutes |",
        f"| batch, learning rate | {train.get('batch_size')}, {_fmt(train.get('lr'))} |",
        f"| precision, seed | {(config.get('kernels') or {}).get('precision', train.get('precision'))}, "
        f"{train.get('seed')} |",
        f"| weights | {'EMA' if (config.get('weights') or {}).get('ema') else 'raw'}, "
        f"{(config.get('weights') or {}).get('dtype', 'float32')} |",
        f"| tinydit | {config.get('tinydit_version')} |",
        "",
        *([config["about"], ""] if config.get("about") else []),
        "## Sampling",
        "",
        f"`tinydit sample` uses the recorded settings: {sampling.get('sampler')}, {sampling.get('steps')} steps, "
        f"guidance {_fmt(sampling.get('cfg_scale'))}"
        + (f" on t in {sampling['cfg_interval']}" if sampling.get("cfg_interval") else "")
        + f" ({sampling.get('source', 'no source')}).",
        "",
        "## Metrics",
        "",
    ]
    return "\n".join(lines + _metrics_section(metrics))


def _metrics_section(metrics: dict | None) -> list[str]:
    """The model card's metrics table and how to measure them again, or how to measure them at all."""
    lines: list[str] = []
    if metrics:
        shown = {
            k: v
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.endswith("_seconds")
        }
        lines += ["| metric | value |", "|---|---|", *[f"| {k} | {_fmt(v)} |" for k, v in shown.items()], ""]
        how = f"`{metrics['command']}`" if metrics.get("command") else "`tinydit eval --checkpoint THIS_FOLDER`"
        lines += [
            f"Measured with {how}, with the recorded sampler settings; `tinydit eval --checkpoint "
            f"THIS_FOLDER --n {metrics.get('n_samples', 1000)} --out eval/` measures them again.",
            "",
        ]
    else:
        lines += [
            "Not measured for this card. Measure them with "
            "`tinydit eval --checkpoint THIS_FOLDER --n 1000 --out eval/` (the recorded sampler settings).",
            "",
        ]
    return lines
