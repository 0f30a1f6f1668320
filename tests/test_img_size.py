"""Your own images at the size they are: an image folder trains at `img_size` (a multiple of the patch size),
and everything after the run (sample, eval, export) follows the checkpoint's size."""

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import fast_config
from PIL import Image

from tinydit import api
from tinydit.config import TrainConfig
from tinydit.data import load_dataset
from tinydit.data.registry import DATASETS, FOLDER_SIZE, folder_record
from tinydit.errors import TinyDiTError
from tinydit.eval.evaluate import spec_for
from tinydit.models.checkpoint import load_checkpoint
from tinydit.train import Trainer
from tinydit.train.resolve import resolve


def pictures(root: Path, n: int = 24, side: int = 80) -> Path:
    """``n`` images of two classes, a bar of a class's colour on a grey ground."""
    for i in range(n):
        img = np.full((side, side, 3), 128, dtype=np.uint8)
        img[:, (i * 7) % (side - 10) :][:, :10] = (200, 40, 40) if i % 2 else (40, 40, 200)
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(root / f"c{i % 2}" / f"{i:03d}.png")
    return root


@pytest.fixture(scope="module")
def run_64(tmp_path_factory) -> Path:
    """A run of two steps on a folder of 80-pixel pictures, trained at 64 pixels: its checkpoint."""
    tmp = tmp_path_factory.mktemp("run64")
    folder = pictures(tmp / "pics")
    cfg = fast_config(tmp / "run", data=str(folder), img_size=64, steps=2, limit=None, batch_size=8, val_size=4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINYDIT_OFFLINE", "1")
        Trainer(cfg, progress=False).fit()
    return tmp / "run" / "checkpoint.pt"


def test_a_64_pixel_folder_trains_samples_and_evaluates_at_64(run_64):
    state = load_checkpoint(run_64)
    assert (state.data.img_size, state.data.channels, state.data.classes) == (64, 3, ("c0", "c1"))
    assert state.train().img_size == 64
    drawn = api.sample(run_64, n=2, steps=2, device="cpu", compile="off")
    assert drawn.x.shape == (2, 3, 64, 64)
    # the evaluation's reference is the folder at the checkpoint's size, and takes its samples
    spec = spec_for(state.data.name, state.data.img_size)
    assert (spec.size, spec.accepted) == (64, ((3, 64),)) and spec.key != spec_for(state.data.name).key


@pytest.mark.slow
def test_a_64_pixel_model_exports_at_64(run_64, tmp_path):
    pytest.importorskip("onnxruntime", reason="the export extra: pip install 'tinydit[export]'")
    from tinydit.export.ort_sampler import OnnxSampler

    exported = OnnxSampler(str(api.export(run_64, "onnx", tmp_path / "model.onnx")))
    assert exported.meta["image"] == {"channels": 3, "size": 64}  # what the web page sizes its canvas by
    noise = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    assert exported.sample(noise, np.zeros(1, dtype=np.int64), steps=2).shape == (1, 3, 64, 64)


def test_an_image_folder_is_read_at_the_size_asked_and_cached_per_size(tmp_path):
    folder = pictures(tmp_path / "pics", n=6)
    at_32 = load_dataset(str(folder))
    at_64 = load_dataset(str(folder), img_size=64)
    assert at_32.images.shape[1:] == (3, FOLDER_SIZE, FOLDER_SIZE) and at_64.images.shape[1:] == (3, 64, 64)
    assert load_dataset(str(folder)).images.shape[-1] == 32  # the 64-pixel decode did not replace the 32 one
    record = folder_record(folder, 48)
    assert (record.img_size, record.channels, record.classes) == (48, 3, ("c0", "c1"))


def test_img_size_is_a_multiple_of_the_patch_size_and_a_built_in_set_keeps_its_own(tmp_path):
    folder = str(pictures(tmp_path / "pics", n=2))
    assert resolve(TrainConfig(data=folder, img_size=48)).img_size == 48
    assert resolve(TrainConfig(data=folder)).img_size is None  # None: FOLDER_SIZE, as old runs stored it
    with pytest.raises(TinyDiTError, match=r"`img_size` 50 must be a multiple of the model's patch size 4 \(32, 48"):
        resolve(TrainConfig(data=folder, img_size=50))
    with pytest.raises(TinyDiTError, match="patch size 2"):
        resolve(TrainConfig(data=folder, img_size=33, preset="dit-32m"))
    with pytest.raises(TinyDiTError, match=r"`img_size` 64: fashion-mnist is 28x28; drop `img_size`"):
        resolve(TrainConfig(data="fmnist", img_size=64))
    assert resolve(TrainConfig(data="shapes", img_size=32)).img_size == 32  # its own size is no error
    with pytest.raises(TinyDiTError, match="`img_size` must be >= 1"):
        TrainConfig(img_size=0)


def test_every_built_in_record_loads_what_it_says(tmp_path):
    """A record's shape and classes are what its loader gives (shapes: rendered here; the others where the
    machine has them)."""
    for record in DATASETS.values():
        try:
            ds = load_dataset(record.name, train=False, limit=4, root=tmp_path)
        except TinyDiTError:  # not on this machine, and tests never download
            continue
        assert ds.images.shape[1:] == (record.channels, record.img_size, record.img_size)
        assert tuple(ds.classes) == record.classes and len(ds.captions) == len(ds) == 4
        assert ds.flip is False  # a held-out split never flips
    assert torch.equal(load_dataset("shapes", limit=3).labels, load_dataset("shapes").labels[:3])
