"""How to sample a model, as one frozen record: ``SamplingSettings``, the single owner of the sampler's
name, its steps, the guidance scale and the sampler's options, from the checkpoint that records them to
the sampler that runs them.

    SamplingSettings(sampler="heun", steps=6, cfg_scale=3.5)   checked once, as it is built
    checkpoint.sampling_settings()                              what a checkpoint records (or would, if old)
    settings.with_flags(steps=8)                                the flags given win, the rest as recorded
    settings.to_json()                                          the checkpoint's ``sampling`` record
    tinydit.flow.samplers.sample(settings, model, noise, y)     sample from given noise with them, unchecked

The measured settings a new run records are data (``sampling_records.json`` beside this module, package
data), read and checked by one function, so a new measurement changes no code. A new run records those of
its data set, preset and conditioning if there are any, else the defaults of ``SamplingSettings``;
``tinydit sweep --apply`` records a run's own best.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import operator
from dataclasses import dataclass
from pathlib import Path

from tinydit.data.registry import BUILTIN_DATASETS
from tinydit.errors import TinyDiTError
from tinydit.flow.grids import DEFAULT_SHIFT, check_grid
from tinydit.flow.objectives import DEFAULT_OBJECTIVE, objective_named
from tinydit.flow.solvers import DEFAULT_ETA, DEFAULT_TOL, SAMPLER_NAMES
from tinydit.models.presets import MODEL_CONDS, MODEL_PRESETS
from tinydit.schema import check_fields

__all__ = [
    "SamplingSettings",
    "SAMPLING_KEYS",
    "SAMPLING_RECORDS",
    "read_sampling_records",
    "recommended_sampling",
]

UNMEASURED = (
    "the default, not measured for this data set and preset: `tinydit sweep --apply` records the best for "
    "this checkpoint"
)


@dataclass(frozen=True)
class SamplingSettings:
    """The settings of one way to sample, complete and checked when built (``TinyDiTError`` names the bad one).

    None leaves an option at the sampler's default, so a record keeps only what was chosen; ``filled()``
    writes the defaults in, for reports."""

    sampler: str = "euler"  # a name of tinydit.flow.samplers.SAMPLERS
    steps: int = 32  # fixed-step samplers: steps; dopri5: 1 / its first trial step
    cfg_scale: float = 2.0  # classifier-free guidance scale s: v_uncond + s (v_cond - v_uncond); 1 = off
    grid: str = "uniform"  # the time grid (tinydit.flow.grids)
    shift: float | None = None  # the shifted grid's shift; None: DEFAULT_SHIFT
    cfg_interval: tuple[float, float] | None = None  # guided only for LO <= t <= HI; None: everywhere
    eta: float | None = None  # ancestral: the share of fresh noise per step; None: DEFAULT_ETA
    rtol: float | None = None  # dopri5's tolerances; None: DEFAULT_TOL
    atol: float | None = None
    source: str = UNMEASURED  # where these settings came from: a measurement, the defaults, flags

    def __post_init__(self):
        try:  # any integer type (a numpy one from a sweep's arange too), never a float or a bool
            if isinstance(self.steps, bool):
                raise TypeError
            object.__setattr__(self, "steps", operator.index(self.steps))
        except TypeError:
            raise TinyDiTError(f"`steps` must be an integer, got {self.steps!r}") from None
        if isinstance(self.cfg_scale, bool) or not isinstance(self.cfg_scale, (int, float)):
            raise TinyDiTError(f"`cfg_scale` (the guidance scale) must be a number, got {self.cfg_scale!r}")
        object.__setattr__(self, "cfg_scale", float(self.cfg_scale))
        if self.cfg_interval is not None:  # a JSON list or a flag's pair, kept as a tuple of floats
            try:
                lo, hi = (float(v) for v in self.cfg_interval)
            except (TypeError, ValueError) as err:
                raise TinyDiTError(f"`cfg_interval` must be two times LO HI, got {self.cfg_interval!r}") from err
            object.__setattr__(self, "cfg_interval", (lo, hi))
        if self.grid is None:
            object.__setattr__(self, "grid", "uniform")
        if not isinstance(self.source, str):
            raise TinyDiTError(f"`source` must say where the settings came from, got {self.source!r}")
        self._check()

    def _check(self) -> None:
        """Raise TinyDiTError for any setting a sampler cannot run with: the one check of a sampler's
        settings, before any work is done (the samplers take them as they are)."""
        if self.sampler not in SAMPLER_NAMES:
            raise TinyDiTError(f"unknown sampler {self.sampler!r}: use one of {', '.join(SAMPLER_NAMES)}")
        if self.steps < 1:
            raise TinyDiTError(f"`steps` must be >= 1, got {self.steps}")
        if not (math.isfinite(self.cfg_scale) and self.cfg_scale >= 0):  # also refuses NaN and inf
            raise TinyDiTError(
                f"`cfg_scale` (the guidance scale) must be >= 0, 1 = off, and finite; got {self.cfg_scale}"
            )
        check_grid(self.grid, self.shift)
        if self.cfg_interval is not None:
            lo, hi = self.cfg_interval
            if not 0 <= lo <= hi <= 1:
                raise TinyDiTError(f"`cfg_interval` LO HI needs 0 <= LO <= HI <= 1 (times, 1 = noise), got {lo} {hi}")
        for name in ("rtol", "atol"):
            tol = getattr(self, name)
            if tol is not None and self.sampler != "dopri5":
                raise TinyDiTError(f"`{name}` applies to the adaptive sampler only; add `sampler` dopri5")
            if tol is not None and not (math.isfinite(tol) and tol > 0):
                raise TinyDiTError(f"`{name}` must be a positive number such as 1e-3, got {tol}")
        if self.eta is not None and self.sampler != "ancestral":
            raise TinyDiTError("`eta` applies to the stochastic sampler only; add `sampler` ancestral")
        if self.eta is not None and not 0 <= self.eta <= 1:
            raise TinyDiTError(f"`eta` must be in [0, 1] (0: deterministic, as Euler; 1: DDPM's noise), got {self.eta}")

    @classmethod
    def from_json(cls, record: dict) -> SamplingSettings:
        """Settings from a record (a checkpoint's ``sampling``, a line of the records file); a key it does
        not know is refused by name, a key it lacks takes the default."""
        _refuse_unknown(set(record) - {"source"})
        return cls(**check_fields(cls, record, None))  # the types first: a list for a name is no TypeError later

    def with_flags(self, **given) -> SamplingSettings:
        """These settings with each one given (not None) in place of the recorded one; ``source`` says which
        came from where. A sampler other than the recorded one drops the recorded sampler's own options
        (eta, rtol, atol), which belong to that sampler."""
        given = {k: v for k, v in given.items() if v is not None}
        _refuse_unknown(set(given))
        changes = dict(given)
        if given.get("sampler", self.sampler) != self.sampler:
            changes |= {k: given.get(k) for k in ("eta", "rtol", "atol")}
        why = (
            f"the checkpoint's recorded settings ({self.source})"
            if not given
            else f"{', '.join(sorted(given))} as given, the rest as recorded ({self.source})"
        )
        return dataclasses.replace(self, **changes, source=why)

    def to_json(self) -> dict:
        """The record a checkpoint keeps (``sampling``): every setting and its source, as JSON reads it back."""
        out = {k: getattr(self, k) for k in SAMPLING_KEYS}
        out["cfg_interval"] = list(self.cfg_interval) if self.cfg_interval is not None else None
        return {**out, "source": self.source}

    def options(self) -> dict:
        """The sampler's options beyond its name, steps and guidance scale, the unset ones left out."""
        return {k: getattr(self, k) for k in SAMPLING_KEYS[3:] if getattr(self, k) is not None}

    def filled(self) -> SamplingSettings:
        """The same settings with the sampler's defaults written in where they apply (for reports)."""
        return dataclasses.replace(
            self,
            shift=(DEFAULT_SHIFT if self.shift is None else self.shift) if self.grid == "shifted" else None,
            eta=(DEFAULT_ETA if self.eta is None else self.eta) if self.sampler == "ancestral" else None,
            rtol=(DEFAULT_TOL if self.rtol is None else self.rtol) if self.sampler == "dopri5" else None,
            atol=(DEFAULT_TOL if self.atol is None else self.atol) if self.sampler == "dopri5" else None,
        )

    def describe(self) -> str:
        """The settings in a few words: "heun, 6 steps, guidance 3.5 on t in [0.1, 0.8]"."""
        what = f"{self.sampler}, {self.steps} steps, guidance {self.cfg_scale:g}"
        if self.cfg_interval and self.cfg_scale != 1:
            what += f" on t in [{self.cfg_interval[0]:g}, {self.cfg_interval[1]:g}]"
        if self.grid != "uniform":
            what += f", {self.grid} grid" + (f" (shift {self.shift:g})" if self.shift else "")
        options = ("eta", "rtol", "atol")
        return what + "".join(f", {k} {getattr(self, k):g}" for k in options if getattr(self, k) is not None)

    @property
    def note(self) -> str:
        """The line a command prints: which settings it samples with, and why."""
        return f"sampling with {self.describe()}: {self.source}"


SAMPLING_KEYS = tuple(f.name for f in dataclasses.fields(SamplingSettings) if f.name != "source")


def _refuse_unknown(keys: set[str]) -> None:
    """Raise, naming them, for keys that are no sampler setting."""
    unknown = keys - set(SAMPLING_KEYS)
    if unknown:
        raise TinyDiTError(f"unknown sampler settings {', '.join(sorted(unknown))}; known: {', '.join(SAMPLING_KEYS)}")


# Measurements, kept as data beside this module (package data) so that a new measurement changes no code.
SAMPLING_RECORDS = Path(__file__).with_name("sampling_records.json")


@functools.cache  # read once per process, however many runs and checkpoints ask
def read_sampling_records(path: Path = SAMPLING_RECORDS) -> dict[tuple[str, str, str], SamplingSettings]:
    """The measured sampler settings in ``path`` by (data, preset, cond). Every record is checked as it is
    read, so an edited file fails here, naming the record, rather than in a training run that records it."""
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


def _check_sampling_record(record: dict) -> tuple[tuple[str, str, str], SamplingSettings]:
    """One record of the sampling records file as its key and settings; raises if invalid."""
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
    if "source" in settings or not {"sampler", "steps", "cfg_scale"} <= set(settings):
        raise TinyDiTError(
            f"`settings` {settings} must give sampler, steps and cfg_scale, and may give only "
            f"{', '.join(SAMPLING_KEYS)}"
        )
    if not isinstance(record["source"], str) or not record["source"]:
        raise TinyDiTError("`source` must say how the settings were measured")
    return (data, preset, cond), SamplingSettings.from_json({**settings, "source": record["source"]})


def recommended_sampling(data: str, preset: str, cond: str, objective: str = DEFAULT_OBJECTIVE) -> SamplingSettings:
    """The sampler settings a new checkpoint records: its objective's own (``Objective.sampling``), else the
    measured record for its data set and preset. ``data`` is the canonical name
    (``tinydit.data.registry.canonical_name``), as a checkpoint records it."""
    own = objective_named(objective).sampling
    if own is not None:
        return SamplingSettings.from_json(own)
    return read_sampling_records().get((data, preset, cond)) or SamplingSettings()
