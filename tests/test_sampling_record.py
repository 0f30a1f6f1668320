"""The sampler settings travel with the checkpoint: recorded at training, used by sample and eval when
no sampler flag is given, overridden flag by flag, and replaced by ``tinydit sweep --apply`` without
touching the weights."""

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest
import torch
from conftest import fast_config

from tinydit import api
from tinydit.checkpoints.checkpoint import load_checkpoint
from tinydit.cli import main
from tinydit.errors import TinyDiTError
from tinydit.flow.settings import SAMPLING_KEYS, SamplingSettings, read_sampling_records, recommended_sampling
from tinydit.models.presets import MODEL_PRESETS
from tinydit.train import Trainer

HEUN = SamplingSettings("heun", 3, 1.5, cfg_interval=(0.2, 0.9), source="a test")


def test_a_checkpoint_records_the_measured_settings_of_its_setup_or_says_it_has_none(tiny_run):
    fmnist = recommended_sampling("fashion-mnist", "dit-1.9m", "class")
    got = (fmnist.sampler, fmnist.steps, fmnist.cfg_scale, fmnist.cfg_interval)
    assert got == ("heun", 6, 3.5, (0.1, 0.8))
    assert "FID" in fmnist.source  # how it was chosen, in the clause that sampling prints
    assert recommended_sampling("shapes", "mmdit-2.3m", "text").sampler == "ancestral"
    assert recommended_sampling("fashion-mnist", "dit-1.9m", "class", "distill").steps == 4  # a student's own
    record = load_checkpoint(tiny_run[0] / "checkpoint.pt").sampling  # shapes dit-0.2m: nothing measured
    assert record["sampler"] == "euler" and "not measured" in record["source"]


def test_every_shipped_sampling_record_is_settings_a_sampler_accepts_for_a_preset_that_exists():
    records = read_sampling_records()
    assert len(records) >= 6 and ("shapes", "dit-1.4m", "class") in records
    presets = {name for table in MODEL_PRESETS.values() for name in table}
    for (data, preset, cond), settings in records.items():
        assert preset in presets, (data, preset, cond)
        assert isinstance(settings, SamplingSettings) and settings.source  # checked as it was built
        # one short clause, printed by every `tinydit sample`: the measurement and its command are in the guide
        assert len(settings.source) <= 60 and ":" not in settings.source and "python" not in settings.source
        assert recommended_sampling(data, preset, cond) == settings  # what a run records
        assert SamplingSettings.from_json(settings.to_json()) == settings  # the checkpoint's record reads back
    assert set(SAMPLING_KEYS) == set(SamplingSettings().to_json()) - {"source"}


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"preset": "dit-9m"}, "unknown preset 'dit-9m'"),
        ({"cond": "text", "preset": "dit-1.4m", "data": "fashion-mnist"}, None),  # valid: text runs on dit
        ({"cond": "class", "preset": "mmdit-2.3m"}, "takes `cond` text"),
        ({"settings": {"sampler": "heun", "steps": 6, "cfg_scale": 3.5, "eta": 0.8}}, "add `sampler` ancestral"),
        ({"settings": {"sampler": "heun", "steps": 6}}, "must give sampler, steps and cfg_scale"),
        ({"settings": {"sampler": "heun", "steps": 6.5, "cfg_scale": 1.0}}, "`steps` must be an integer"),
        ({"source": ""}, "`source`"),
        ({"when": "today"}, "unknown fields when"),
    ],
)
def test_a_broken_sampling_record_is_refused_by_name(tmp_path, change, error):
    settings = {"sampler": "ancestral", "steps": 64, "cfg_scale": 50.0, "cfg_interval": [0.8, 1.0]}
    record = {"data": "shapes", "preset": "dit-1.4m", "cond": "class", "source": "a test", "settings": settings}
    path = tmp_path / "records.json"
    path.write_text(json.dumps({"records": [{**record, **change}]}))
    if error is None:
        assert len(read_sampling_records(path)) == 1
        return
    with pytest.raises(TinyDiTError, match="record 0: .*" + re.escape(error)):
        read_sampling_records(path)


def test_a_missing_or_malformed_sampling_records_file_says_so(tmp_path):
    with pytest.raises(TinyDiTError, match="missing: reinstall tinydit"):
        read_sampling_records(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"record": []}')
    with pytest.raises(TinyDiTError, match="not a sampling records file"):
        read_sampling_records(tmp_path / "bad.json")
    two = {
        "data": "shapes",
        "preset": "dit-1.4m",
        "cond": "class",
        "source": "a test",
        "settings": {"sampler": "euler", "steps": 8, "cfg_scale": 2.0},
    }
    (tmp_path / "two.json").write_text(json.dumps({"records": [two, two]}))
    with pytest.raises(TinyDiTError, match="record 1: a second record"):
        read_sampling_records(tmp_path / "two.json")


def _with_record(tiny_run, tmp_path, record) -> str:
    ckpt = tmp_path / "checkpoint.pt"
    shutil.copyfile(tiny_run[0] / "checkpoint.pt", ckpt)
    api.record_sampling(ckpt, record)
    return ckpt


def test_sample_uses_the_record_and_a_flag_overrides_its_field_alone(tiny_run, tmp_path, capsys):
    ckpt = _with_record(tiny_run, tmp_path, HEUN)
    res = api.sample(ckpt, n=4)
    assert res.settings.sampler == "heun" and res.settings.cfg_interval == (0.2, 0.9)
    # Heun 3 on the uniform grid, guided on [0.2, 0.9]: t = 1 (1) and its corrector at 2/3 (2), then 2/3 (2) and
    # 1/3 (2), then 1/3 (2) and a plain Euler step to 0: 9 evaluations
    assert res.nfe == 9
    assert "the checkpoint's recorded settings (a test)" in res.settings.note
    res = api.sample(ckpt, n=4, steps=2)
    assert (res.settings.sampler, res.settings.steps, res.settings.cfg_scale) == ("heun", 2, 1.5)
    assert "steps as given, the rest as recorded" in res.settings.note
    res = api.sample(ckpt, n=4, sampler="euler", steps=4, cfg_scale=1.0)
    assert res.nfe == 4  # every flag given: the record is not used at all
    assert main(["sample", "--checkpoint", ckpt, "--n", 2, "--out", tmp_path / "x.png"]) == 0
    assert "sampling with heun, 3 steps, guidance 1.5 on t in [0.2, 0.9]" in capsys.readouterr().err
    metrics = api.evaluate(checkpoint=ckpt, n=20, out=tmp_path / "eval")
    assert metrics["sampler"]["sampler"] == "heun" and "recorded" in metrics["sampler_note"]
    ancestral = _with_record(tiny_run, tmp_path, SamplingSettings("ancestral", 2, 1.0, eta=0.8))
    assert "sampling with ancestral, 2 steps, guidance 1, eta 0.8:" in api.sample(ancestral, n=2).settings.note


def test_sweep_apply_records_the_best_within_the_budget_and_never_touches_the_weights(tiny_run, tmp_path, capsys):
    ckpt = tmp_path / "checkpoint.pt"
    shutil.copyfile(tiny_run[0] / "checkpoint.pt", ckpt)
    before = load_checkpoint(ckpt)
    assert (
        main(
            [
                "sweep",
                "--checkpoint",
                ckpt,
                "--samplers",
                "euler,heun",
                "--steps",
                "2,8",
                "--cfg",
                "1,2",
                "--n",
                20,
                "--max-nfe",
                8,
                "--apply",
                "--no-progress",
                "--out",
                tmp_path / "sweep",
            ]
        )
        == 0
    )
    after = load_checkpoint(ckpt)
    rows = [r for r in api.sweep_rows(tmp_path / "sweep") if r["nfe"] <= 8]
    best = min(rows, key=lambda r: r["fid_shapes_cnn"])
    assert (after.sampling["sampler"], after.sampling["steps"]) == (best["sampler"], best["steps"])
    assert "tinydit sweep --apply" in after.sampling["source"] and "within 8" in after.sampling["source"]
    for key in ("model", "ema"):
        assert all(torch.equal(getattr(before, key)[k], getattr(after, key)[k]) for k in getattr(before, key)), key
    assert before.to_dict().keys() == after.to_dict().keys() and before.step == after.step
    assert "recorded in" in capsys.readouterr().err
    # a continued run keeps the applied record
    run = tmp_path / "continued"
    Trainer(fast_config(run, steps=8), progress=False).fit()
    api.record_sampling(run / "checkpoint.pt", HEUN)
    Trainer(fast_config(run, steps=10), progress=False).fit()
    assert load_checkpoint(run / "checkpoint.pt").sampling == HEUN.to_json()


def test_the_run_sample_grids_draw_with_the_recorded_settings(tmp_path, monkeypatch):
    """What samples.png shows is what `tinydit sample` draws: the record's sampler, steps, guidance and
    interval, `sample_steps` and `sample_cfg` overriding theirs as `--steps` and `--cfg-scale` would."""
    import tinydit.train.diagnostics as diagnostics_module

    calls = []
    real = diagnostics_module.sample

    def spy(settings, *args, **kw):  # sample(settings, model, noise, y, generator=..., on_step=...)
        calls.append((settings.sampler, settings.steps, settings.cfg_scale, settings.cfg_interval))
        return real(settings, *args, **kw)

    monkeypatch.setattr(diagnostics_module, "sample", spy)
    trainer = Trainer(fast_config(tmp_path / "a", steps=1, sample_steps=None, sample_cfg=None), progress=False)
    trainer.sampling = HEUN
    trainer.fit()
    assert calls == [("heun", 3, 1.5, (0.2, 0.9))]
    calls.clear()
    trainer = Trainer(fast_config(tmp_path / "b", steps=1, sample_steps=2, sample_cfg=4.0), progress=False)
    trainer.sampling = HEUN
    trainer.fit()
    assert calls == [("heun", 2, 4.0, (0.2, 0.9))]


def test_sampling_settings_are_checked_once_merged_flag_by_flag_and_read_back_from_json():
    with pytest.raises(TinyDiTError, match="`steps` must be an integer"):
        SamplingSettings("euler", 4.0, 1.0)
    with pytest.raises(TinyDiTError, match="`cfg_scale` .* must be a number"):
        SamplingSettings("euler", 4, "2")
    with pytest.raises(TinyDiTError, match="`eta` applies to the stochastic sampler only"):
        SamplingSettings("heun", 4, 1.0, eta=0.5)
    with pytest.raises(TinyDiTError, match="unknown sampler settings cfg; known: sampler, steps, cfg_scale"):
        SamplingSettings.from_json({"sampler": "euler", "steps": 4, "cfg": 2.0})
    with pytest.raises(TinyDiTError, match="unknown sampler settings scale"):
        HEUN.with_flags(scale=2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        HEUN.steps = 8  # one owner: a changed setting is a new record, with its source
    record = HEUN.to_json()
    assert record["cfg_interval"] == [0.2, 0.9] and json.loads(json.dumps(record)) == record
    assert SamplingSettings.from_json(record) == HEUN
    assert HEUN.with_flags() == dataclasses.replace(HEUN, source="the checkpoint's recorded settings (a test)")
    euler = HEUN.with_flags(sampler="euler", cfg_scale=None)  # None: not given
    assert (euler.sampler, euler.steps, euler.cfg_scale, euler.cfg_interval) == ("euler", 3, 1.5, (0.2, 0.9))
    assert euler.source == "sampler as given, the rest as recorded (a test)"
    ancestral = SamplingSettings("ancestral", 8, 1.0, eta=0.5, source="a test")
    assert ancestral.with_flags(sampler="euler").eta is None  # the record's eta belonged to its sampler
    assert ancestral.with_flags(steps=4).eta == 0.5
    filled = SamplingSettings("dopri5", 16, 2.0, grid="shifted").filled()
    assert (filled.shift, filled.rtol, filled.atol, filled.eta) == (3.0, 1e-3, 1e-3, None)
    assert SamplingSettings("euler", 8, 2.0).filled() == SamplingSettings("euler", 8, 2.0)
    assert HEUN.note == "sampling with heun, 3 steps, guidance 1.5 on t in [0.2, 0.9]: a test"
    assert SamplingSettings("ancestral", 8, 1.0, eta=0.0).describe() == "ancestral, 8 steps, guidance 1, eta 0"
    assert SamplingSettings("euler", np.int64(8), 2.0).steps == 8  # a sweep's numpy integers are integers too


def test_the_guidance_scale_flag_has_one_name_and_keeps_its_short_alias(tiny_run, tmp_path, capsys):
    ckpt = tiny_run[0] / "checkpoint.pt"
    for flag in ("--cfg-scale", "--cfg"):
        assert main(["sample", "--checkpoint", ckpt, "--n", 2, "--steps", 1, flag, 3, "--out", tmp_path / "a.png"]) == 0
        assert "guidance 3: cfg_scale, steps as given" in capsys.readouterr().err
    assert main(["sample", "--checkpoint", ckpt, "--cfg", -1, "--out", tmp_path / "b.png"]) == 2
    assert "error: --cfg-scale (the guidance scale) must be >= 0" in capsys.readouterr().err
