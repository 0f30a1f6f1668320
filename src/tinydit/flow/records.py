"""The sampler settings a checkpoint records for sampling and evaluation: measurements kept as data
(``sampling_records.json`` beside this module, package data), read and checked by one function, so a new
measurement changes no code.

A checkpoint's ``sampling`` holds every key of ``SAMPLING_KEYS`` and a "source" saying where the settings
came from. A new run records the measured settings of its data set, preset and conditioning if there are
any, else ``SAMPLING_DEFAULT``; ``tinydit sweep --apply`` records a run's own best.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tinydit.data.names import BUILTIN_DATASETS
from tinydit.errors import TinyDiTError
from tinydit.flow.samplers import check_sampler_args
from tinydit.models.presets import MODEL_CONDS, MODEL_PRESETS

__all__ = [
    "SAMPLING_KEYS",
    "SAMPLING_DEFAULT",
    "SAMPLING_RECORDS",
    "split_sampling",
    "read_sampling_records",
    "recommended_sampling",
    "recorded_sampling",
]

SAMPLING_KEYS = ("sampler", "steps", "cfg_scale", "grid", "shift", "cfg_interval", "eta", "rtol", "atol")
SAMPLING_DEFAULT = {
    "sampler": "euler",
    "steps": 32,
    "cfg_scale": 2.0,
    "grid": "uniform",
    "shift": None,
    "cfg_interval": None,
    "eta": None,
    "rtol": None,
    "atol": None,
}
# Measurements, kept as data beside this module (package data) so that a new measurement changes no code.
SAMPLING_RECORDS = Path(__file__).with_name("sampling_records.json")


def split_sampling(settings: dict) -> tuple[str, int, float, dict]:
    """A sampling record (``SAMPLING_KEYS``, e.g. a checkpoint's ``sampling``) as a sampler's arguments:
    (sampler, steps, cfg_scale, options), the options without the unset ones and the interval a tuple."""
    options = {k: settings[k] for k in SAMPLING_KEYS[3:] if settings.get(k) is not None}
    if "cfg_interval" in options:
        options["cfg_interval"] = tuple(options["cfg_interval"])
    return settings["sampler"], settings["steps"], settings["cfg_scale"], options


@functools.cache  # read once per process, however many runs and checkpoints ask
def read_sampling_records(path: Path = SAMPLING_RECORDS) -> dict[tuple[str, str, str], dict]:
    """The measured sampler settings in ``path`` by (data, preset, cond), each the settings it gives (a
    subset of SAMPLING_KEYS) and its "source". Read once per path and shared: copy a record to change it.

    Every record is checked as it is read, so an edited file fails here, naming the record, rather than
    in a training run that records its settings."""
    try:
        records = json.loads(Path(path).read_text())["records"]
    except FileNotFoundError as err:
        raise TinyDiTError(f"the sampling records {path} are missing: reinstall tinydit") from err
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise TinyDiTError(
            f"{path} is not a sampling records file (JSON with a list of `records`): {type(err).__name__}: {err}"
        ) from err
    table = {}
    for i, record in enumerate(records):
        try:
            key, found = _check_sampling_record(record)
        except (TinyDiTError, KeyError, TypeError, ValueError, AttributeError) as err:
            raise TinyDiTError(f"{path}, record {i}: {err}") from err
        if key in table:
            raise TinyDiTError(f"{path}, record {i}: a second record for {key}; keep one")
        table[key] = found
    return table


def _check_sampling_record(record: dict) -> tuple[tuple[str, str, str], dict]:
    """One record of the sampling records file as its key and settings (with "source"); raises if invalid."""
    unknown = set(record) - {"data", "preset", "cond", "settings", "source"}
    if unknown:
        raise TinyDiTError(f"unknown fields {', '.join(sorted(unknown))}")
    data, preset, cond = record["data"], record["preset"], record["cond"]
    if data not in BUILTIN_DATASETS:
        raise TinyDiTError(f"`data` {data!r} is not a built-in data set ({', '.join(BUILTIN_DATASETS)})")
    model = next((m for m, presets in MODEL_PRESETS.items() if preset in presets), None)
    if model is None:
        raise TinyDiTError(f"unknown preset {preset!r}")
    if cond not in MODEL_CONDS[model]:
        raise TinyDiTError(f"preset {preset} takes `cond` {' or '.join(MODEL_CONDS[model])}, got {cond!r}")
    settings = dict(record["settings"])
    unknown = set(settings) - set(SAMPLING_KEYS)
    if unknown or not {"sampler", "steps", "cfg_scale"} <= set(settings):
        raise TinyDiTError(
            f"`settings` {settings} must give sampler, steps and cfg_scale, and may give only "
            f"{', '.join(SAMPLING_KEYS)}"
        )
    if isinstance(settings["steps"], bool) or not isinstance(settings["steps"], int):
        raise TinyDiTError(f"`steps` must be an integer, got {settings['steps']!r}")
    check_sampler_args(**{**SAMPLING_DEFAULT, **settings})
    if not isinstance(record["source"], str) or not record["source"]:
        raise TinyDiTError("`source` must say how the settings were measured")
    return (data, preset, cond), {**settings, "source": record["source"]}


def recommended_sampling(data: str, preset: str, cond: str, few_step: str = "none") -> dict:
    """The sampler settings a new checkpoint records: complete (every key of SAMPLING_KEYS) and sourced.
    ``data`` is the canonical name (``tinydit.data.names.canonical_name``), as a checkpoint records it."""
    if few_step == "distill":  # guidance is in the teacher's paths, and the student learned Euler jumps
        found = {
            "sampler": "euler",
            "steps": 4,
            "cfg_scale": 1.0,
            "source": "a distilled student takes 1, 2, 4 or 8 Euler steps at guidance 1",
        }
    elif few_step == "meanflow":  # the average velocity over [0, 1]: one step, guidance folded into training
        found = {
            "sampler": "euler",
            "steps": 1,
            "cfg_scale": 1.0,
            "source": "a mean-flow model samples in one Euler step of its average velocity, guided in training",
        }
    else:
        found = read_sampling_records().get((data, preset, cond))
    if found is None:
        return {
            **SAMPLING_DEFAULT,
            "source": "the default, not measured for this data set and preset: "
            "`tinydit sweep --apply` records the best for this checkpoint",
        }
    settings = {**SAMPLING_DEFAULT, **found}
    settings["cfg_interval"] = list(settings["cfg_interval"]) if settings["cfg_interval"] else None
    return settings


def recorded_sampling(state: dict) -> dict:
    """The sampler settings a checkpoint records (``sampling``), or, for one written before they were
    recorded, those its data set and preset would record now."""
    if isinstance(state.get("sampling"), dict):
        return state["sampling"]
    train, data = state.get("train_config") or {}, state.get("data") or {}
    cond = (state.get("model_config") or {}).get("cond", "class")  # an incomplete checkpoint fails in load_model
    return recommended_sampling(data.get("name", ""), train.get("preset", ""), cond, train.get("few_step", "none"))
