"""Training on captions: the loss falls, runs resume exactly, held-out combinations stay unseen, the
empty caption replaces dropped ones, and the checkpoint rebuilds the model and its tokenizer."""

import json

import pytest
import torch
from conftest import fast_config
from PIL import Image

from tinydit.checkpoints.checkpoint import load_checkpoint, load_model
from tinydit.config import TrainConfig
from tinydit.data.text import BOS, PAD, holds_phrase, tokenizer_of
from tinydit.errors import TinyDiTError
from tinydit.models.dit import DiT
from tinydit.models.mmdit import MMDiT
from tinydit.train import Trainer
from tinydit.train.resolve import NOISEWARD_SHIFT, SHAPES_HOLDOUT, resolve

MMDIT = dict(model="mmdit", preset="mmdit-0.2m")
TEXT_DIT = dict(model="dit", preset="dit-0.2m", cond="text")


def _states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", [MMDIT, TEXT_DIT], ids=["mmdit", "dit-text"])
def test_the_validation_loss_falls_on_shapes_captions(tmp_path, kind):
    cfg = fast_config(
        tmp_path, **kind, steps=50, batch_size=32, limit=1024, val_size=64, warmup=5, lr=2e-3, val_every=1000
    )
    trainer = Trainer(cfg, progress=False)
    before = trainer.validation_losses(trainer.run.model)[0]  # the zero prediction: about E|noise - x0|^2
    result = trainer.fit()
    assert result.val_loss < 0.7 * before, (before, result.val_loss)


def test_a_resumed_text_run_ends_with_exactly_the_weights_of_an_uninterrupted_one(tmp_path):
    kw = dict(**MMDIT, batch_size=8, limit=20, class_dropout=0.3)
    straight = Trainer(fast_config(tmp_path / "a", steps=6, **kw), progress=False)
    straight.fit()
    Trainer(fast_config(tmp_path / "b", steps=3, **kw), progress=False).fit()
    resumed = Trainer(fast_config(tmp_path / "b", steps=6, **kw), progress=False)
    assert resumed.run.step == 3
    resumed.fit()
    assert _states_equal(straight.run.model.state_dict(), resumed.run.model.state_dict())
    assert _states_equal(straight.run.ema.state_dict(), resumed.run.ema.state_dict())


def test_held_out_combinations_are_never_trained_on_and_everything_is_recorded(tmp_path):
    trainer = Trainer(fast_config(tmp_path, **MMDIT, steps=2, sample_every=2), progress=False)
    assert trainer.cfg.holdout == SHAPES_HOLDOUT == "red triangle,blue circle"  # the shapes default, written out
    phrases = ("red triangle", "blue circle")
    assert trainer.data.n_held_out > 0 and not any(holds_phrase(c, phrases) for c in trainer.data.train_set.captions)
    assert len(trainer.data.train_set) + trainer.data.n_held_out == 256  # --limit, before the hold-out
    ids = trainer.data.train_tokens
    assert ids.shape == (len(trainer.data.train_set), 8) and bool((ids[:, 0] == BOS).all())
    assert trainer.data.tokenizer.decode(ids[:3]) == trainer.data.train_set.captions[:3]
    trainer.fit()

    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "mmdit" and config["train"]["holdout"] == "red triangle,blue circle"
    assert config["text"]["holdout"] == list(phrases) and config["text"]["held_out_images"] == trainer.data.n_held_out
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    model, _ = load_model(state)
    assert isinstance(model, MMDiT) and model.config.vocab_size == 16
    assert tokenizer_of(state) == trainer.data.tokenizer and "red" in tokenizer_of(state).vocab  # words seen apart
    held_prompts = ["a red triangle on a green background", "a blue circle on a yellow background"]
    assert list(state.data.prompts[-2:]) == list(held_prompts)
    # The sample grid: one row of 8 per prompt, 8 prompts (34 px per 32 px image with its border).
    assert Image.open(tmp_path / "samples.png").size == (8 * 34 + 2, 8 * 34 + 2)


def test_the_text_dit_checkpoint_is_a_dit_and_class_runs_store_no_tokenizer(tmp_path, tiny_run):
    Trainer(fast_config(tmp_path, **TEXT_DIT, steps=1, holdout="none"), progress=False).fit()
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    model, _ = load_model(state)
    assert type(model) is DiT and model.config.cond == "text" and state.holdout == ""
    class_state = load_checkpoint(tiny_run[0] / "checkpoint.pt")
    assert tokenizer_of(class_state) is None and class_state.model_type == "dit"
    assert class_state.train().cond == "class" and class_state.holdout is None


def test_dropped_captions_become_the_empty_caption(tmp_path):
    trainer = Trainer(fast_config(tmp_path, **MMDIT, steps=4, batch_size=64, class_dropout=0.5), progress=False)
    seen = []
    trainer.run.forward = lambda x, t, y: (seen.append(y.clone()), trainer.run.model(x, t, y))[1]
    for _ in range(4):
        trainer.train_step()
    y = torch.cat(seen)  # (256, L)
    empty = (y[:, 0] == BOS) & (y[:, 1:] == PAD).all(1)
    assert 0.35 < empty.float().mean() < 0.65  # about half, and exactly the empty caption
    assert bool((y[~empty, 1:] != PAD).all())  # the others keep their whole 7-word caption


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(model="mmdit", cond="class"), "use `model` dit for class labels"),
        (dict(model="mmdit", preset="dit-0.2m"), "unknown preset 'dit-0.2m' for `model` mmdit: use one of mmdit-0.2m"),
        (dict(model="unet"), "unknown `model` 'unet'"),
        (dict(holdout="red triangle"), "add `cond` text"),
        (dict(model="mmdit", holdout="red triangle,,"), "empty phrase"),
    ],
)
def test_config_errors_name_the_fix(kwargs, match):
    with pytest.raises(TinyDiTError, match=match):
        resolve(TrainConfig(**kwargs))


def test_continuing_a_class_run_as_a_text_run_is_refused(tmp_path):
    Trainer(fast_config(tmp_path, steps=1), progress=False).fit()
    with pytest.raises(TinyDiTError, match="model: 'dit' -> 'mmdit'"):
        Trainer(fast_config(tmp_path, **MMDIT, steps=2), progress=False)


def test_a_holdout_that_matches_nothing_warns(tmp_path):
    with pytest.warns(UserWarning, match="'purple triangle' matches no training caption"):
        Trainer(fast_config(tmp_path, **MMDIT, steps=1, holdout="red triangle,purple triangle"), progress=False)


def test_training_times_default_by_conditioning_and_data():
    """Text runs: logit-normal; class runs on RGB data (x-prediction): logit-normal shifted towards noise;
    Fashion-MNIST class runs (v-prediction): uniform. An explicit choice stays."""
    times = lambda **kw: (resolve(TrainConfig(**kw)).t_sampling, resolve(TrainConfig(**kw)).t_shift)  # noqa: E731
    assert times(model="mmdit") == times(model="dit", cond="text") == ("logit-normal", 1.0)
    assert times() == times(data="cifar10") == ("logit-normal", NOISEWARD_SHIFT)  # shapes is the default data
    assert times(data="fashion-mnist") == ("uniform", 1.0)
    assert times(model="mmdit", t_sampling="uniform") == ("uniform", 1.0)
    assert times(t_sampling="uniform", t_shift=1.0) == ("uniform", 1.0)


def test_a_text_run_evaluates_its_own_prompts_and_hold_out_while_it_trains(tmp_path):
    """The evaluation during training asks the run's own data (its tokenizer, its held-out phrases) for prompt
    adherence, the metric a shapes text run keeps best.pt by, as `tinydit eval` asks its checkpoint."""
    cfg = fast_config(tmp_path, **MMDIT, steps=2, batch_size=8, limit=64, eval_every=2, eval_n=20)
    Trainer(cfg, progress=False).fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evaluation = next(r for r in records if "eval/adherence_all_all" in r)
    assert evaluation["best_metric"] == "adherence_all_all" and evaluation["step"] == 2
    held = load_checkpoint(tmp_path / "checkpoint.pt").holdout
    assert held == "red triangle,blue circle" and "eval/adherence_all_held_out" in evaluation
