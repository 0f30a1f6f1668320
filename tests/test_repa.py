"""REPA's representation alignment (tinydit.train.repa): what it trains, what it saves, what it refuses."""

import json

import pytest
import torch
from conftest import fast_config

from tinydit import api
from tinydit.checkpoints.checkpoint import load_checkpoint
from tinydit.config import TrainConfig
from tinydit.data.shapes import ShapesDataset
from tinydit.errors import TinyDiTError
from tinydit.eval.features import load_feature_net
from tinydit.models.dit import DiT
from tinydit.models.dit_config import DiTConfig
from tinydit.train import Trainer
from tinydit.train.repa import REPA_DEPTH, Alignment
from tinydit.train.resolve import resolve


def _states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _model(depth: int = 4) -> DiT:
    torch.manual_seed(0)
    return DiT(DiTConfig(img_size=32, in_channels=3, patch_size=4, dim=32, depth=depth, n_heads=2, n_classes=4))


def test_a_class_token_is_not_aligned():
    torch.manual_seed(0)
    model = DiT(DiTConfig(patch_size=4, dim=32, depth=2, n_heads=2, n_classes=4, class_token=True))
    align = Alignment(model, "shapes_repa")
    x0 = torch.rand(3, 3, 32, 32) * 2 - 1
    model(torch.randn_like(x0), torch.rand(3), torch.tensor([0, 1, 2]))
    assert align._tokens.shape == (3, 64, 32)  # the 8 x 8 image tokens, not the class token after them
    assert -1 <= align.loss(x0).item() <= 1


def test_the_alignment_trains_the_early_blocks_and_the_projector_only():
    model = _model()
    align = Alignment(model, "shapes_repa")
    for p in model.parameters():  # past adaLN-Zero's zeros, so that every block passes a gradient
        p.data.normal_(0, 0.05)
    x0 = torch.rand(3, 3, 32, 32) * 2 - 1
    model(torch.randn_like(x0), torch.rand(3), torch.tensor([0, 1, 2]))
    loss = align.loss(x0)
    assert -1 <= loss.item() <= 1
    loss.backward()
    grads = {n: p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters()}
    early = [n for n in grads if n.startswith(tuple(f"blocks.{i}." for i in range(REPA_DEPTH)))]
    assert early and all(grads[n] for n in early if "adaLN" not in n)
    assert not any(v for n, v in grads.items() if n.startswith(("blocks.2.", "blocks.3.", "final.")))
    assert all(p.grad is not None for p in align.projector.parameters())
    # the encoder is frozen, outside the module's parameters and state
    assert sum(p.numel() for p in align.parameters()) == sum(p.numel() for p in align.projector.parameters())
    assert all(k.startswith("projector.") for k in align.state_dict())
    with pytest.raises(TinyDiTError, match="forward pass on the same images first"):
        align.loss(x0)  # the tokens of one forward pass are used once


def test_an_mmdit_aligns_the_image_tokens_of_its_second_joint_block():
    """A joint block returns (image tokens, caption tokens): the alignment takes the image stream, and its
    gradient reaches both joint blocks' image weights."""
    from tinydit.models.mmdit import MMDiT, MMDiTConfig

    torch.manual_seed(0)
    config = MMDiTConfig(
        img_size=32, in_channels=3, patch_size=4, dim=32, depth=2, single_blocks=1, n_heads=2, n_classes=4,
        cond="text", vocab_size=16, text_len=8, text_depth=1,
    )  # fmt: skip
    model = MMDiT(config)
    align = Alignment(model, "shapes_repa")
    for p in model.parameters():  # past adaLN-Zero's zeros
        p.data.normal_(0, 0.05)
    x0 = torch.rand(3, 3, 32, 32) * 2 - 1
    captions = torch.randint(3, 16, (3, 8))
    model(torch.randn_like(x0), torch.rand(3), captions)
    assert align._tokens.shape == (3, 64, 32)  # the 8 x 8 image tokens, not the 8 caption tokens
    loss = align.loss(x0)
    loss.backward()
    for block in model.blocks:
        assert block.x.attn.qkv.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.single_blocks.parameters())  # after the aligned tokens


def test_the_target_is_the_shipped_encoder_feature_map_on_the_token_grid():
    align = Alignment(_model(), "shapes_repa")
    net, record = load_feature_net("shapes_repa")
    assert record["data"] == "shapes"
    x0 = torch.rand(2, 3, 32, 32) * 2 - 1
    target = align.target(x0)  # (N, T, F): 8 x 8 tokens of 4 x 4 pixels
    assert target.shape == (2, 64, net.feature_dim)
    with torch.no_grad():
        pooled = net.body(x0)  # the encoder's own global average of the same map
    torch.testing.assert_close(target.mean(1), pooled, rtol=1e-4, atol=1e-5)


def test_the_fashion_mnist_encoder_maps_its_grid_onto_the_tokens_of_a_28_px_model():
    """28 x 28 grey images in patches of 4: 7 x 7 tokens, the encoder's own 7 x 7 map, cell for cell."""
    torch.manual_seed(0)
    model = DiT(DiTConfig(img_size=28, in_channels=1, patch_size=4, dim=32, depth=2, n_heads=2, n_classes=10))
    align = Alignment(model, "fmnist_repa")
    net, record = load_feature_net("fmnist_repa")
    assert record["data"] == "fashion-mnist" and record["test_accuracy"] > 0.85
    x0 = torch.rand(2, 1, 28, 28) * 2 - 1
    target = align.target(x0)  # (N, T, F)
    assert target.shape == (2, 49, net.feature_dim)
    body = list(net.body)
    pool = next(i for i, m in enumerate(body) if isinstance(m, torch.nn.AdaptiveAvgPool2d))
    with torch.no_grad():
        fmap = torch.nn.Sequential(*body[:pool])(x0)  # (N, F, 7, 7)
    torch.testing.assert_close(target, fmap.flatten(2).transpose(1, 2))


def test_the_target_in_bf16_points_where_the_float32_target_points():
    """A bf16 run's autocast computes the encoder in bf16: on real images its features keep their direction
    (what the cosine loss reads) to within bf16's rounding. A wrong bf16 kernel for one of its convolutions
    (as oneDNN's for the patch embedding's shape was, tests/test_model.py) would turn them elsewhere."""
    align = Alignment(_model(), "shapes_repa")
    x0 = torch.stack([ShapesDataset(n=16, train=False)[i][0] for i in range(16)])
    full = align.target(x0)
    with torch.autocast("cpu", torch.bfloat16):
        half = align.target(x0)
    assert half.dtype == torch.float32
    cos = torch.nn.functional.cosine_similarity(full, half, dim=-1)  # (N, T)
    assert cos.min() > 0.999, cos.min()
    # and a cosine this close is not what any two feature maps give: other images' are far from it
    assert torch.nn.functional.cosine_similarity(full, full.roll(1, 0), dim=-1).mean() < 0.9


def test_a_repa_run_continues_exactly_and_its_checkpoint_is_the_model_alone(tmp_path):
    kw = dict(steps=6, batch_size=8, limit=20, repa=0.5)
    straight = Trainer(fast_config(tmp_path / "a", **kw), progress=False)
    straight.fit()
    Trainer(fast_config(tmp_path / "b", **{**kw, "steps": 3}), progress=False).fit()
    resumed = Trainer(fast_config(tmp_path / "b", **kw), progress=False)
    assert resumed.run.step == 3
    resumed.fit()
    assert _states_equal(straight.run.model.state_dict(), resumed.run.model.state_dict())
    assert _states_equal(straight.run.alignment.projector.state_dict(), resumed.run.alignment.projector.state_dict())
    # and the alignment changed the training: a run without it ends elsewhere
    plain = Trainer(fast_config(tmp_path / "c", **{**kw, "repa": 0.0}), progress=False)
    plain.fit()
    assert not _states_equal(straight.run.model.state_dict(), plain.run.model.state_dict())
    # the log keeps the flow-matching loss and the alignment's apart
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "loss" in r]
    assert logged and all(-1 <= r["repa_loss"] <= 1 and r["loss"] > 0 for r in logged)
    # the checkpoint samples as any other; the projector is training state, not part of the model
    state = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    assert state.repa_projector is not None and state.train().repa == 0.5
    assert state.model.keys() == load_checkpoint(tmp_path / "c" / "checkpoint.pt").model.keys()
    assert api.sample(tmp_path / "a" / "checkpoint.pt", 4, steps=2).x.shape == (4, 3, 32, 32)
    # continuing with another weight is refused, naming the setting
    with pytest.raises(TinyDiTError, match="repa: 0.5 -> 0.0"):
        Trainer(fast_config(tmp_path / "a", **{**kw, "steps": 8, "repa": 0.0}), progress=False)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(repa=-1.0), "`repa` must be >= 0"),
        (dict(repa=0.5, objective="shortcut"), "`repa` works with `objective` flow"),
        (dict(repa=0.5, model="mmdit", preset="mmdit-0.2m"), "aligns the tokens after block 2; the model has 1"),
        (dict(repa=0.5, preset="dit-0.2m", data="cifar10"), "there is one for shapes, fashion-mnist, not for cifar10"),
    ],
)
def test_an_alignment_the_run_cannot_do_is_refused_before_anything_is_written(tmp_path, change, message):
    with pytest.raises(TinyDiTError, match=message):
        Trainer(fast_config(tmp_path / "run", **change), progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "given, expected",
    [
        (dict(data="shapes"), 0.5),  # the default: shapes class runs of a DiT align
        (dict(data="shapes", repa=0.0), 0.0),  # and may be told not to
        (dict(data="shapes", repa=1.0), 1.0),
        (dict(data="fashion-mnist"), 0.0),  # an encoder, but a mixed gain for a dearer step: when asked
        (dict(data="fashion-mnist", repa=0.5), 0.5),
        (dict(data="shapes", cond="text"), 0.0),  # the pooled-text DiT: not measured with it
        (dict(data="shapes", model="mmdit"), 0.5),  # the text-to-image MMDiT aligns
        (dict(data="shapes", model="mmdit", preset="mmdit-0.2m"), 0.0),  # one joint block: too shallow
        (dict(data="fashion-mnist", model="mmdit", cond="text"), 0.0),
        (dict(data="shapes", objective="shortcut"), 0.0),
        (dict(data="shapes", objective="meanflow"), 0.5),  # mean flows align too, and may be told not to
        (dict(data="shapes", objective="meanflow", repa=0.0), 0.0),
        (dict(data="fashion-mnist", objective="meanflow"), 0.0),
    ],
)
def test_the_alignment_is_on_by_default_where_it_was_measured_and_off_elsewhere(given, expected):
    assert resolve(TrainConfig(out="unused", **given)).repa == expected


def test_a_dataset_object_is_not_aligned_to_the_encoder_of_the_name_in_the_config():
    """api.train(cfg, dataset=...) trains the object, whatever `data` says: no shipped encoder knows it."""

    class Stripes(torch.utils.data.Dataset):
        pass

    assert resolve(TrainConfig(out="unused", data="shapes"), Stripes()).repa == 0.0
    with pytest.raises(TinyDiTError, match="there is one for shapes, fashion-mnist, not for dataset:Stripes"):
        resolve(TrainConfig(out="unused", data="shapes", repa=0.5), Stripes())


def test_a_run_stored_before_the_alignment_existed_reads_as_one_without_it(tmp_path):
    """Its stored config has no `repa`: it continues with `repa` 0, and the new default is refused by name."""
    Trainer(fast_config(tmp_path, steps=2, repa=0.0), progress=False).fit()
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)  # the file as an older release wrote it
    del state["train_config"]["repa"]
    torch.save(state, tmp_path / "checkpoint.pt")
    assert load_checkpoint(tmp_path / "checkpoint.pt").train().repa == 0.0
    with pytest.raises(TinyDiTError, match="repa: 0.0 -> 0.5"):
        Trainer(fast_config(tmp_path, steps=4, repa=None), progress=False)  # the default now aligns
    trainer = Trainer(fast_config(tmp_path, steps=4, repa=0.0), progress=False)
    assert trainer.run.step == 2 and trainer.run.alignment is None
    trainer.close()


def test_kept_targets_are_the_encoders_computed_once_and_the_same_bits_whatever_shares_their_batch():
    """The kept target of an image is its computed target (in bf16), the encoder runs on each image once, and
    the bits do not depend on the batch it came in (a continued run meets its images in other batches); a
    flipped image keeps a target of its own."""
    from tinydit.train.repa import TARGET_BATCH

    align = Alignment(_model(), "shapes_repa")
    assert align.keep_targets(40)
    ds = ShapesDataset(n=40, train=False)
    x0 = torch.stack([ds[i][0] for i in range(40)])  # (40, C, H, W)
    seen = []

    def compute(x):
        seen.append(len(x))
        return align.target(x)

    cache = align._kept
    index, plain = torch.arange(40), torch.zeros(40, dtype=torch.bool)
    whole = cache.get(x0, index, plain, compute)  # (40, T, F)
    chunks = [TARGET_BATCH] * -(-40 // TARGET_BATCH)
    assert seen == chunks  # 40 new images: batches of the fixed size, the last one padded
    torch.testing.assert_close(whole, align.target(x0).to(torch.bfloat16).float())
    again = cache.get(x0[:5], index[:5], plain[:5], compute)
    assert seen == chunks and torch.equal(again, whole[:5])  # kept: no encoder call
    # Another cache meets the images three at a time, with a duplicate: the same bits.
    other = Alignment(_model(), "shapes_repa")
    other.keep_targets(40)
    for part in index.split(3):
        twice = torch.cat([part, part[:1]])
        got = other._kept.get(x0[twice], twice, plain[: len(twice)], other.target)
        assert torch.equal(got, whole[twice])
    # The mirrored image is another row: its own target, not the unflipped one's.
    mirrored = cache.get(x0[:4].flip(-1), index[:4], ~plain[:4], compute)
    assert len(seen) == len(chunks) + 1 and not torch.equal(mirrored, whole[:4])
    torch.testing.assert_close(mirrored, align.target(x0[:4].flip(-1)).to(torch.bfloat16).float())


def test_targets_too_large_to_keep_are_computed_every_step(monkeypatch):
    import tinydit.train.repa as repa

    align = Alignment(_model(), "shapes_repa")
    tokens, features = 64, align.projector[-1].out_features
    monkeypatch.setattr(repa, "MAX_KEPT_BYTES", 2 * 100 * tokens * features * 2)
    assert align.keep_targets(100) and not align.keep_targets(101)
    x0 = torch.rand(2, 3, 32, 32) * 2 - 1
    model_tokens = torch.randn(2, 64, 32)
    align._tokens = model_tokens
    expected = -torch.nn.functional.cosine_similarity(align.projector(model_tokens), align.target(x0), dim=-1).mean()
    align._tokens = model_tokens
    got = align.loss(x0, (torch.tensor([0, 1]), torch.tensor([False, False])))  # keys ignored: nothing kept
    torch.testing.assert_close(got, expected)
