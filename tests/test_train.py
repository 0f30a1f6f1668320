import dataclasses
import json
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import fashion_mnist_available, fast_config

import tinydit.models.linear as linear_module
from tinydit.checkpoints.checkpoint import FORMAT_VERSION, Checkpoint, load_checkpoint, load_model
from tinydit.errors import TinyDiTError
from tinydit.models.linear import linear_backend
from tinydit.train import Trainer
from tinydit.train.optim import adamw, ema_update

HAS_FMNIST = fashion_mnist_available()
FIXTURE = Path(__file__).parent / "fixtures" / "dit-0.2m.pt"  # a checkpoint of an older release


def _states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resumed_run_ends_with_exactly_the_weights_of_an_uninterrupted_one(tmp_path):
    straight = Trainer(fast_config(tmp_path / "a", steps=6, batch_size=8, limit=20), progress=False)
    straight.fit()  # 20 images, batch 8: crosses an epoch boundary at step 2 and 4

    Trainer(fast_config(tmp_path / "b", steps=3, batch_size=8, limit=20), progress=False).fit()
    resumed = Trainer(fast_config(tmp_path / "b", steps=6, batch_size=8, limit=20), progress=False)
    assert resumed.run.step == 3
    resumed.fit()

    assert _states_equal(straight.run.model.state_dict(), resumed.run.model.state_dict())
    assert _states_equal(straight.run.ema.state_dict(), resumed.run.ema.state_dict())
    a, b = straight.run.opt.state_dict()["state"], resumed.run.opt.state_dict()["state"]
    assert all(_states_equal(a[k], b[k]) for k in a)
    # and the checkpoint on disk holds the same weights
    assert _states_equal(load_checkpoint(tmp_path / "b" / "checkpoint.pt").model, straight.run.model.state_dict())


def test_a_continued_run_keeps_the_token_linear_kernel_it_started_with(tmp_path, monkeypatch):
    """auto's kernel comes from a timing probe, which a new process may answer otherwise: the checkpoint's
    record wins, so the continuation is exact."""
    kw = dict(batch_size=8, limit=20)
    with linear_backend("onednn"):  # the kernel a first process picked
        straight = Trainer(fast_config(tmp_path / "a", steps=6, **kw), progress=False)
        straight.fit()
        Trainer(fast_config(tmp_path / "b", steps=3, **kw), progress=False).fit()
    assert load_checkpoint(tmp_path / "b" / "checkpoint.pt").kernels["token_linears"] == "onednn"
    monkeypatch.setattr(linear_module, "_onednn_faster", False)  # a later process whose probe says BLAS
    resumed = Trainer(fast_config(tmp_path / "b", steps=6, **kw), progress=False)
    assert resumed.run.kernels()["token_linears"] == "onednn"
    resumed.fit()
    assert _states_equal(straight.run.model.state_dict(), resumed.run.model.state_dict())
    # a new run follows the probe
    assert Trainer(fast_config(tmp_path / "c", steps=1, **kw), progress=False).run.kernels()["token_linears"] == "blas"


def test_checkpoint_round_trip_and_contents(tiny_run):
    out, result = tiny_run
    raw = torch.load(out / "checkpoint.pt", weights_only=True)  # the file: a plain dict
    assert raw["format_version"] == FORMAT_VERSION and raw["step"] == result.step == 8
    assert {"model", "ema", "optimizer", "rng", "model_config", "train_config", "data"} <= raw.keys()
    state = load_checkpoint(out / "checkpoint.pt")
    assert (
        state.step == 8
        and state.missing_to_continue == []
        and state.data.classes == ("circle", "square", "triangle", "cross")
    )
    assert state.config.to_dict() == raw["model_config"] and state.train().preset == "dit-0.2m"
    model, _ = load_model(state, ema=True)
    assert _states_equal(model.state_dict(), state.ema)
    assert not _states_equal(state.ema, state.model)
    # written back, it is the same file (the release that wrote it aside)
    state.save(out / "again.pt")
    again = torch.load(out / "again.pt", weights_only=True)
    assert again.keys() == raw.keys() and again["data"] == raw["data"] and again["train_config"] == raw["train_config"]
    assert _states_equal(again["model"], raw["model"]) and again["sampling"] == raw["sampling"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["train"]["preset"] == "dit-0.2m" and cfg["model"]["dim"] == 64 and cfg["processes"] == 1
    assert cfg["kernels"]["token_linears"] in ("blas", "onednn") and cfg["kernels"]["attention"] == "sdpa"  # fp32
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("val_loss" in r for r in lines) and any("img_per_s" in r for r in lines)
    assert (out / "samples.png").exists()


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    tiny = Checkpoint.load(FIXTURE)
    dataclasses.replace(tiny, step=1).save(path)

    def broken_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        dataclasses.replace(tiny, step=2).save(path)
    monkeypatch.undo()
    assert load_checkpoint(path).step == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temp file left behind


def test_foreign_and_future_checkpoints_are_clear_errors(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(TinyDiTError, match="not a TinyDiT checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    with pytest.raises(TinyDiTError, match="not a readable TinyDiT checkpoint"):
        load_checkpoint(tmp_path / "junk.pt")
    Checkpoint.load(FIXTURE).save(tmp_path / "future.pt")
    state = torch.load(tmp_path / "future.pt", weights_only=True)
    state["format_version"] = FORMAT_VERSION + 1
    torch.save(state, tmp_path / "future.pt")
    with pytest.raises(TinyDiTError, match="format version"):
        load_checkpoint(tmp_path / "future.pt")


def test_continuing_with_other_settings_is_refused_and_keeps_the_run(tmp_path):
    Trainer(fast_config(tmp_path, steps=2), progress=False).fit()
    before = (tmp_path / "checkpoint.pt").read_bytes()
    with pytest.raises(TinyDiTError, match="preset: 'dit-0.2m' -> 'dit-1.9m'"):
        Trainer(fast_config(tmp_path, steps=4, preset="dit-1.9m"), progress=False)
    assert (tmp_path / "checkpoint.pt").read_bytes() == before
    fresh = Trainer(fast_config(tmp_path, steps=1, seed=3), overwrite=True, progress=False)
    assert fresh.run.step == 0


def test_cooldown_decays_the_learning_rate_linearly_over_the_last_steps(tmp_path):
    trainer = Trainer(fast_config(tmp_path, steps=10, warmup=2, cooldown=4, lr=1e-3), progress=False)
    lrs = [trainer.budget.lr_at(s) for s in range(10)]
    assert lrs == pytest.approx([5e-4] + [1e-3] * 5 + [1e-3, 7.5e-4, 5e-4, 2.5e-4])
    trainer.fit()
    logged = {
        r["step"]: r["lr"] for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "lr" in r
    }
    assert logged[10] == trainer.run.opt.param_groups[0]["lr"] == pytest.approx(2.5e-4)  # the last step's rate
    with pytest.raises(TinyDiTError, match="`cooldown` 4 .* give `steps` of at least 4 \\(got 3\\)"):
        fast_config(tmp_path, steps=3, cooldown=4)
    with pytest.raises(TinyDiTError, match="got none"):
        fast_config(tmp_path, steps=None, minutes=1.0, cooldown=4)


def test_a_run_continued_into_its_cooldown_ends_as_one_uninterrupted_run(tmp_path):
    """Steps before the decay starts do not depend on --steps or --cooldown, so a constant-rate run can be
    continued with a cool-down; once the decay has started, the schedule is fixed."""
    kw = dict(batch_size=8, limit=20, warmup=1)
    straight = Trainer(fast_config(tmp_path / "a", steps=6, cooldown=3, **kw), progress=False)
    straight.fit()
    Trainer(fast_config(tmp_path / "b", steps=3, **kw), progress=False).fit()  # constant rate so far
    Trainer(fast_config(tmp_path / "b", steps=5, cooldown=2, **kw), progress=False).fit()  # decays from 3
    with pytest.raises(TinyDiTError, match="past the start of a learning-rate cool-down"):  # at step 5 it is fixed
        Trainer(fast_config(tmp_path / "b", steps=6, cooldown=3, **kw), progress=False)
    Trainer(fast_config(tmp_path / "c", steps=3, **kw), progress=False).fit()
    resumed = Trainer(fast_config(tmp_path / "c", steps=6, cooldown=3, **kw), progress=False)
    resumed.fit()
    assert _states_equal(straight.run.model.state_dict(), resumed.run.model.state_dict())
    constant = Trainer(fast_config(tmp_path / "d", steps=6, **kw), progress=False)
    constant.fit()
    decayed, constant = straight.run.model.state_dict(), constant.run.model.state_dict()
    assert not _states_equal(decayed, constant)  # the decay did something


def test_resume_flag_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(TinyDiTError, match="`resume`"):
        Trainer(fast_config(tmp_path, steps=2), require_resume=True, progress=False)


def test_minutes_budget_stops_the_run(tmp_path, monkeypatch):
    """A fake clock that advances 0.1 s per reading: the run stops at the first step boundary at or past
    its 1.2 s budget, whatever the machine's speed."""
    import types

    import tinydit.train.budget as budget_module

    now = [0.0]

    def perf_counter():
        now[0] += 0.1
        return now[0]

    monkeypatch.setattr(
        budget_module,
        "time",
        types.SimpleNamespace(perf_counter=perf_counter, strftime=time.strftime, gmtime=time.gmtime),
    )
    result = Trainer(fast_config(tmp_path, steps=None, minutes=0.02), progress=False).fit()
    assert 1 <= result.step and 1.2 <= result.train_seconds < 1.2 + 1.0  # at most one step's readings past it


def test_ema_update_is_a_lerp():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    expected = 0.9 * a.weight.detach() + 0.1 * b.weight.detach()
    ema_update(a, b, 0.9)
    assert torch.allclose(a.weight, expected)


@pytest.mark.skipif(not HAS_FMNIST, reason="Fashion-MNIST is absent (./data and Debian's dataset-fashion-mnist)")
def test_fashion_mnist_validation_loss_falls(tmp_path):
    cfg = fast_config(
        tmp_path,
        data="fashion-mnist",
        steps=60,
        batch_size=64,
        limit=4096,
        val_size=256,
        warmup=10,
        val_every=1000,
        lr=2e-3,
    )
    trainer = Trainer(cfg, progress=False)
    assert trainer.model_config.in_channels == 1 and trainer.model_config.img_size == 28
    before = trainer.validation_losses(trainer.run.model)[0]
    result = trainer.fit()
    assert result.val_loss < 0.8 * before, (before, result.val_loss)


def test_ctrl_c_stops_at_a_step_boundary_and_the_resume_stays_exact(tmp_path, monkeypatch):
    import signal

    straight = Trainer(fast_config(tmp_path / "a", steps=6, batch_size=8, limit=20), progress=False)
    straight.fit()

    original = Trainer.train_step

    def interrupted_mid_step(self):
        if self.run.step == 3:
            signal.raise_signal(signal.SIGINT)  # arrives in the middle of step 4's work
        return original(self)

    monkeypatch.setattr(Trainer, "train_step", interrupted_mid_step)
    with pytest.raises(KeyboardInterrupt):
        Trainer(fast_config(tmp_path / "b", steps=6, batch_size=8, limit=20), progress=False).fit()
    monkeypatch.setattr(Trainer, "train_step", original)
    assert load_checkpoint(tmp_path / "b" / "checkpoint.pt").step == 4  # the step it was in, completed
    resumed = Trainer(fast_config(tmp_path / "b", steps=6, batch_size=8, limit=20), progress=False)
    resumed.fit()
    assert _states_equal(straight.run.model.state_dict(), resumed.run.model.state_dict())
    assert _states_equal(straight.run.ema.state_dict(), resumed.run.ema.state_dict())


def test_non_finite_weights_never_replace_a_good_checkpoint(tmp_path):
    trainer = Trainer(fast_config(tmp_path, steps=2), progress=False)
    trainer.fit()
    good = (tmp_path / "checkpoint.pt").read_bytes()
    with torch.no_grad():
        next(trainer.run.model.parameters()).fill_(float("nan"))
    with pytest.raises(TinyDiTError, match="NaN or infinite.*last good checkpoint is kept"):
        trainer.save()
    assert (tmp_path / "checkpoint.pt").read_bytes() == good


def test_losses_are_logged_per_bin_of_t(tmp_path):
    trainer = Trainer(fast_config(tmp_path, steps=4, log_every=4, val_every=4, val_size=40), progress=False)
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = next(r for r in records if "loss_by_t" in r)
    val = next(r for r in records if "val_loss_ema_by_t" in r)
    assert len(train["loss_by_t"]) == len(val["val_loss_ema_by_t"]) == 10
    # 64 uniform times fill most bins; every bin's mean is a loss, and they average back to the total.
    seen = [v for v in train["loss_by_t"] if v is not None]
    assert len(seen) >= 8 and all(v > 0 for v in seen)
    assert abs(sum(val["val_loss_ema_by_t"]) / 10 - val["val_loss_ema"]) < 1e-4  # 40 images: 4 per bin

    class WrongNearNoise(torch.nn.Module):  # predicts 0 for t < 0.5 and a far-off 10 from there on
        def forward(self, x, t, y):
            return 10.0 * (t >= 0.5).float().view(-1, 1, 1, 1).expand_as(x)

    total, by_t = trainer.validation_losses(WrongNearNoise())
    assert max(by_t[:5]) < 3 and min(by_t[5:]) > 50  # the error shows up in exactly the bins of t >= 0.5


def test_a_run_continues_with_its_own_architecture_after_its_preset_changes(tmp_path, monkeypatch):
    from tinydit.models import dit_config as model_module  # where the presets live

    Trainer(fast_config(tmp_path, steps=1), progress=False).fit()
    changed = {**model_module.PRESETS, "dit-0.2m": {**model_module.PRESETS["dit-0.2m"], "mlp": "swiglu"}}
    monkeypatch.setattr(model_module, "PRESETS", changed)
    resumed = Trainer(fast_config(tmp_path, steps=2), progress=False)
    assert resumed.run.step == 1 and resumed.model_config.mlp == "gelu"
    resumed.fit()
    assert Trainer(fast_config(tmp_path / "new", steps=1), progress=False).model_config.mlp == "swiglu"


def test_the_trainers_adamw_is_fused_on_a_cpu_and_takes_the_plain_adamw_step():
    start = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    grad = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    params = []
    for make in (
        lambda p: adamw([p], torch.device("cpu"), lr=0.1, weight_decay=0.05),
        lambda p: torch.optim.AdamW([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.05),
    ):
        p = torch.nn.Parameter(start.clone())
        opt = make(p)
        for _ in range(3):
            p.grad = grad.clone()
            opt.step()
        params.append(p.detach())
        if len(params) == 1:
            assert opt.defaults["fused"] is True
    torch.testing.assert_close(params[0], params[1], rtol=1e-6, atol=1e-6)
    assert not torch.equal(params[0], start)


def test_a_run_begun_with_the_unfused_adamw_continues_with_it_exactly(tmp_path):
    """Checkpoints from before the fused AdamW: the continuation builds the optimizer they were written
    with, so it is exact, and fp16's gradient scaler takes the unfused step (a fused optimizer loaded with
    unfused settings would hand the scaler's arguments to an unfused step, which rejects them)."""
    kw = dict(batch_size=8, limit=20)

    def unfused(*a, **k):  # the old trainer's optimizer: PyTorch's default (unfused) AdamW
        return adamw(*a, **{**k, "fused": False})

    straight = Trainer(fast_config(tmp_path / "a", steps=6, **kw), progress=False, optimizer=unfused)
    straight.fit()
    Trainer(fast_config(tmp_path / "b", steps=3, **kw), progress=False, optimizer=unfused).fit()
    resumed = Trainer(fast_config(tmp_path / "b", steps=6, **kw), progress=False)
    assert not resumed.run.opt.defaults["fused"] and not resumed.run.opt.param_groups[0]["fused"]
    resumed.fit()
    assert _states_equal(straight.run.model.state_dict(), resumed.run.model.state_dict())

    scaler = torch.amp.GradScaler("cpu")  # fp16's scaler (CUDA only in the trainer), on the resumed optimizer
    for p in resumed.run.model.parameters():
        p.grad = torch.ones_like(p)
    scaler.scale(torch.ones(()))
    scaler.unscale_(resumed.run.opt)
    scaler.step(resumed.run.opt)
    scaler.update()


def test_a_class_filter_trains_on_those_classes_relabelled_in_the_order_given(tmp_path, capsys):
    from tinydit.cli import main

    trainer = Trainer(fast_config(tmp_path, steps=2, classes="cross,0"), progress=False)
    assert trainer.data.train_set.classes == ["cross", "circle"] and trainer.model_config.n_classes == 2
    kept = trainer.data.train_set
    assert set(kept.labels.tolist()) == {0, 1} and len(kept) == 256  # limit counts kept ones
    captions = {c.split(" on ")[0].split()[-1] for c in trainer.data.train_set.captions}
    assert captions == {"cross", "circle"}  # the images are the ones asked for
    trainer.fit()
    assert load_checkpoint(tmp_path / "checkpoint.pt").data.classes == ("cross", "circle")
    assert main(["train", "--data", "shapes", "--classes", "hexagon", "--out", tmp_path / "bad"]) == 2
    err = capsys.readouterr().err
    assert "unknown class 'hexagon' in --classes: the data has circle, square, triangle, cross" in err


def test_batch_size_defaults_by_data_and_is_written_down(tmp_path):
    """None resolves per data set (DEFAULT_BATCH_SIZES: 64 on shapes, else 128); a given batch stays, and the
    resolved one is what config.json records, so a continuation compares like with like."""
    from tinydit.config import TrainConfig
    from tinydit.train.resolve import DEFAULT_BATCH_SIZES, resolve

    assert DEFAULT_BATCH_SIZES["shapes"] == 64
    assert resolve(TrainConfig()).batch_size == resolve(TrainConfig(data="shapes", model="mmdit")).batch_size == 64
    assert resolve(TrainConfig(data="fashion-mnist")).batch_size == 128
    assert resolve(TrainConfig(data="cifar10")).batch_size == 128
    assert resolve(TrainConfig(data=str(tmp_path))).batch_size == 128  # an image folder
    assert resolve(TrainConfig(batch_size=32)).batch_size == 32
    assert TrainConfig.from_dict(resolve(TrainConfig()).to_dict()).batch_size == 64
    with pytest.raises(TinyDiTError, match="`batch_size` must be >= 1"):
        TrainConfig(batch_size=0)


def test_resolving_fills_a_new_config_and_a_resolved_one_resolves_to_itself():
    """The config as given is never rewritten (its None defaults stay None); the resolved one is complete,
    and resolving it again (a continued run's stored config) changes nothing."""
    from tinydit.config import TrainConfig
    from tinydit.train.resolve import resolve

    given = TrainConfig(data="fmnist", minutes=2)
    resolved = resolve(given)
    assert given == TrainConfig(data="fmnist", minutes=2) and given.preset is None and given.lr is None
    assert None not in (
        resolved.preset,
        resolved.cond,
        resolved.batch_size,
        resolved.lr,
        resolved.t_sampling,
        resolved.t_shift,
        resolved.cooldown_frac,
    )
    assert resolved.cooldown_frac == 0.2 and resolved.steps is None and resolved.t_sampling == "uniform"
    assert resolve(resolved) == resolved == resolve(TrainConfig.from_dict(resolved.to_dict()))
    assert resolve(TrainConfig()).steps == 2000


def test_the_resolved_config_names_the_data_once_and_every_later_part_reads_that_name(tmp_path, monkeypatch):
    """`data` resolves to the name the checkpoint records (canonical, a folder's absolute path, or the class of
    a Dataset given from Python); a run and its evaluation never make a name canonical again."""
    from torch.utils.data import TensorDataset

    import tinydit.data.registry as names
    from tinydit.config import TrainConfig
    from tinydit.train.resolve import resolve

    assert resolve(TrainConfig(data="FMNIST")).data == "fashion-mnist"
    assert resolve(TrainConfig(data=str(tmp_path / "imgs" / ".."))).data == str(tmp_path.resolve())
    pairs = TensorDataset(torch.zeros(4, 3, 8, 8), torch.zeros(4, dtype=torch.long))
    for_pairs = resolve(TrainConfig(), pairs)
    assert for_pairs.data == "dataset:TensorDataset" and for_pairs.batch_size == 64  # the defaults of `data` given
    assert resolve(for_pairs) == for_pairs
    made_canonical = []
    real = names.canonical_name
    for module in [m for name, m in sys.modules.items() if name.startswith("tinydit")]:
        if getattr(module, "canonical_name", None) is real:
            monkeypatch.setattr(module, "canonical_name", lambda name: made_canonical.append(name) or real(name))
    trainer = Trainer(fast_config(tmp_path / "run", data="Shapes", steps=2, eval_every=2, eval_n=20), progress=False)
    trainer.fit()
    assert made_canonical == ["Shapes"]  # by resolve, once; the evaluation and the checkpoint read "shapes"
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt").train().data == "shapes"


def test_preset_defaults_by_model_data_and_conditioning():
    """None resolves through DEFAULT_DATA_PRESETS (shapes class runs: dit-1.4m), else the model's default;
    a named preset always wins, and the resolved name is what the run's config records."""
    from tinydit.config import TrainConfig
    from tinydit.train.resolve import DEFAULT_DATA_PRESETS, resolve

    def preset(**kw):
        return resolve(TrainConfig(**kw)).preset

    assert DEFAULT_DATA_PRESETS == {("dit", "shapes", "class"): "dit-1.4m"}
    assert preset() == preset(data="Shapes") == "dit-1.4m"
    assert preset(data="fashion-mnist") == preset(data="shapes", cond="text") == "dit-1.9m"
    assert preset(data="shapes", model="mmdit") == "mmdit-2.3m"
    assert preset(preset="dit-1.9m") == "dit-1.9m"
    assert TrainConfig.from_dict(resolve(TrainConfig()).to_dict()).preset == "dit-1.4m"
    with pytest.raises(TinyDiTError, match="takes `cond` text"):  # the conditioning is checked before the lookup
        resolve(TrainConfig(model="mmdit", cond="class"))
    with pytest.raises(TinyDiTError, match="unknown preset 'dit-9m' for `model` dit: use one of dit-0.2m"):
        resolve(TrainConfig(preset="dit-9m"))


def test_learning_rate_defaults_by_data_and_is_written_down(tmp_path):
    """None resolves per data set (DEFAULT_LRS: 2e-3 on shapes, else 1e-3); a given rate stays and is checked."""
    from tinydit.config import TrainConfig
    from tinydit.train.resolve import DEFAULT_LRS, resolve

    assert DEFAULT_LRS == {"shapes": 2e-3}
    assert resolve(TrainConfig()).lr == resolve(TrainConfig(data="shapes", model="mmdit")).lr == 2e-3
    assert resolve(TrainConfig(data="fashion-mnist")).lr == resolve(TrainConfig(data=str(tmp_path))).lr == 1e-3
    assert resolve(TrainConfig(lr=5e-4)).lr == 5e-4
    assert TrainConfig.from_dict(resolve(TrainConfig(data="fmnist")).to_dict()).lr == 1e-3
    trainer = Trainer(fast_config(tmp_path, steps=1, warmup=1), progress=False)
    assert trainer.run.opt.param_groups[0]["lr"] == 2e-3  # the optimizer gets the resolved rate
    with pytest.raises(TinyDiTError, match="`lr` must be > 0"):
        TrainConfig(lr=0.0)


def test_the_objective_the_model_builder_and_the_optimizer_are_parameters_of_the_run(tmp_path):
    """An experiment swaps a part of the run by passing it, without monkeypatching the trainer or its modules."""
    from tinydit.flow.objectives import StepLoss, flow_matching
    from tinydit.models.registry import build_model

    seen = {}

    def doubled(forward, model, batch):  # plain flow matching, minimised twice as hard
        seen["batch"] = len(batch.x)
        loss = flow_matching(forward, model, batch)
        return StepLoss(2 * loss.minimised, loss.reported, loss.per_sample, loss.at_t)

    def built(kind, config):
        seen["kind"] = kind
        return build_model(kind, config)

    def sgd(params, device, lr, weight_decay=0.0, fused=None):
        return torch.optim.SGD(params, lr=lr)

    default = Trainer(fast_config(tmp_path / "a", steps=3), progress=False)
    default.fit()
    swapped = Trainer(
        fast_config(tmp_path / "b", steps=3), progress=False, objective=doubled, build_model=built, optimizer=sgd
    )
    swapped.fit()
    assert seen == {"batch": swapped.batch_size, "kind": "dit"} and isinstance(swapped.run.opt, torch.optim.SGD)
    assert "nesterov" in load_checkpoint(tmp_path / "b" / "checkpoint.pt").optimizer["param_groups"][0]  # SGD's
    assert not _states_equal(default.run.model.state_dict(), swapped.run.model.state_dict())


def test_an_objective_that_does_not_fit_the_run_is_refused_before_anything_is_written(tmp_path):
    from tinydit.flow.objectives import flow_matching, mean_flow, shortcut

    for objective in (mean_flow, shortcut):
        with pytest.raises(TinyDiTError, match=f"the run's `objective` is flow: set `objective` {objective.name}"):
            Trainer(fast_config(tmp_path / "r", steps=1), progress=False, objective=objective)

    def loss(forward, model, batch):
        return flow_matching(forward, model, batch)

    with pytest.raises(TinyDiTError, match="distill trains on its teacher's paths: it takes no loss function"):
        Trainer(fast_config(tmp_path / "r", objective="distill", teacher="none.pt"), objective=loss)
    assert not (tmp_path / "r").exists()
