"""The text pipeline: tokenizer round trips and unknown words, the text encoder's padding mask, captions
for every data set, held-out phrases."""

import io
import json
import warnings

import pytest
import torch
from PIL import Image

from tinydit.data import load_dataset
from tinydit.data.shapes import ShapesDataset
from tinydit.data.text import BOS, PAD, UNK, Tokenizer, class_captions, empty_like, holds_phrase, parse_phrases, words
from tinydit.errors import TinyDiTError
from tinydit.models.text_encoder import TextEncoder

SHAPES_CAPTIONS = ShapesDataset(n=300).captions


def test_tokenizer_round_trip_on_the_shapes_captions():
    tok = Tokenizer.from_captions(SHAPES_CAPTIONS)
    # 4 shapes, 6 colours and "a", "on", "background"; the 3 special ids come first.
    assert len(tok.vocab) == 13 and tok.vocab_size == 16 and tok.max_len == 1 + 7
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the training captions hold no unknown word
        ids = tok.encode(SHAPES_CAPTIONS)
    assert ids.shape == (300, 8) and ids.dtype == torch.int64
    assert bool((ids[:, 0] == BOS).all()) and bool((ids[:, 1:] >= 3).all())  # every caption has 7 words
    assert tok.decode(ids) == SHAPES_CAPTIONS
    assert len(set(map(tuple, ids.tolist()))) == len(set(SHAPES_CAPTIONS))  # distinct captions, distinct ids


def test_case_punctuation_and_padding():
    tok = Tokenizer.from_captions(["a red circle on a blue background", "a cross"])
    ids = tok.encode(["A RED, red circle!", ""])
    assert tok.decode(ids) == ["a red red circle", ""]
    assert ids[0, 5:].tolist() == [PAD] * 3 and ids[1].tolist() == [BOS] + [PAD] * 7
    assert torch.equal(ids[1:], empty_like(ids[:1]))  # the empty caption: BOS, then padding
    assert words("t-shirt, ankle-boot & it's") == ["t-shirt", "ankle-boot", "it's"]


def test_unknown_words_are_named_in_a_warning_and_read_as_unk():
    tok = Tokenizer.from_captions(SHAPES_CAPTIONS)
    with pytest.warns(UserWarning, match=r"unknown words 'purple' in 'a purple hexagon.*'hexagon'"):
        ids = tok.encode(["a purple hexagon on a red background"])
    assert ids[0, :4].tolist() == [BOS, tok.ids["a"], UNK, UNK]
    assert tok.decode(ids) == ["a <unk> <unk> on a red background"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tok.encode(["a purple circle"], warn=False)  # validation captions: silent


def test_captions_longer_than_the_model_reads_are_cut_with_a_warning():
    tok = Tokenizer.from_captions(["a red circle"])
    with pytest.warns(UserWarning, match="longer than this model's 3 words"):
        ids = tok.encode(["a red circle a red circle"])
    assert tok.decode(ids) == ["a red circle"]


def test_tokenizer_survives_a_weights_only_checkpoint():
    tok = Tokenizer.from_captions(SHAPES_CAPTIONS)
    json.dumps(tok.to_dict())  # plain data
    buf = io.BytesIO()
    torch.save({"tokenizer": tok.to_dict()}, buf)
    buf.seek(0)
    back = Tokenizer.from_dict(torch.load(buf, weights_only=True)["tokenizer"])
    assert back == tok and torch.equal(back.encode(SHAPES_CAPTIONS[:5]), tok.encode(SHAPES_CAPTIONS[:5]))


@pytest.mark.parametrize(
    "vocab, max_len, match",
    [
        (("red", "red"), 4, "distinct"),
        (("Red",), 4, "lower-case"),
        (("red",), 0, "max_len must be >= 1"),
    ],
)
def test_bad_tokenizers_are_refused(vocab, max_len, match):
    with pytest.raises(TinyDiTError, match=match):
        Tokenizer(vocab, max_len)
    with pytest.raises(TinyDiTError, match="hold no words"):
        Tokenizer.from_captions(["", "!!"])


def _encoder(**kw) -> TextEncoder:
    torch.manual_seed(0)
    enc = TextEncoder(vocab_size=10, max_len=6, dim=16, depth=2, n_heads=2, **kw)
    for p in enc.parameters():  # off the default init, so every weight matters
        p.data.add_(0.3 * torch.randn_like(p))
    return enc


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_text_encoder_padding_changes_nothing(mlp):
    enc = _encoder(mlp=mlp)
    ids = torch.tensor([[BOS, 3, 4, 5, PAD, PAD], [BOS, 7, PAD, PAD, PAD, PAD], [BOS, PAD, PAD, PAD, PAD, PAD]])
    ctx, pooled, keep = enc(ids)
    assert ctx.shape == (3, 6, 16) and pooled.shape == (3, 16) and torch.equal(keep, ids != PAD)
    assert torch.isfinite(ctx).all() and torch.isfinite(pooled).all()  # the empty caption too
    torch.testing.assert_close(pooled, (ctx * keep[..., None]).sum(1) / keep.sum(1, keepdim=True))
    with torch.no_grad():  # whatever the padding's embedding and positions, the real tokens see the same
        enc.tok_embed.weight[PAD] = 100 * torch.randn(16)
        enc.pos_embed[:, 4:] += 10 * torch.randn(2, 16)  # padding in every row
    ctx2, pooled2, _ = enc(ids)
    torch.testing.assert_close(pooled2, pooled)
    torch.testing.assert_close(ctx2[keep], ctx[keep])
    assert not torch.allclose(ctx2[~keep], ctx[~keep])  # (the padding's own outputs did change)


def test_text_encoder_reads_order_and_refuses_bad_ids():
    enc = _encoder()
    ctx, pooled, _ = enc(torch.tensor([[BOS, 3, 4], [BOS, 4, 3]]))  # shorter than max_len is fine
    assert not torch.allclose(pooled[0], pooled[1], atol=1e-4)  # the same words in another order
    with pytest.raises(TinyDiTError, match=r"L <= 6"):
        enc(torch.ones(2, 7, dtype=torch.long))
    with pytest.raises(TinyDiTError, match=r"\(N, L\)"):
        enc(torch.ones(2, dtype=torch.long))


def test_holdout_phrases_match_whole_words_in_a_row():
    assert parse_phrases(" Red triangle, blue  circle,red triangle") == ("red triangle", "blue circle")
    assert parse_phrases("none") == parse_phrases("") == ()
    with pytest.raises(TinyDiTError, match="empty phrase"):
        parse_phrases("red triangle,,")
    assert holds_phrase("A red triangle on a blue background", ("red triangle",))
    assert not holds_phrase("a red square on a triangle background", ("red triangle",))
    assert not holds_phrase("a bored triangle", ("red triangle",))  # words, not substrings


def test_every_data_set_has_captions(tmp_path):
    shapes = load_dataset("shapes", train=False, limit=5)
    assert shapes.captions[0].startswith("a ") and shapes.captions[0].endswith(" background")
    assert class_captions([7, 0], ["t-shirt"] * 7 + ["sneaker"]) == ["a photo of a sneaker", "a photo of a t-shirt"]
    for rel in ("cats/1.png", "cats/2.png", "dogs/3.png", "dogs/4.png"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        Image.new("RGB", (8, 8), (200, 10, 10)).save(tmp_path / rel)
    (tmp_path / "cats" / "2.txt").write_text("  A sleepy\ncat.\n")
    folder = load_dataset(str(tmp_path), train=True)  # 4 images: too few to hold any out
    assert sorted(folder.captions) == ["A sleepy cat.", "cats", "dogs", "dogs"]
