import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import fashion_mnist_available, fast_config
from PIL import Image

from tinydit.data import (
    FASHION_MNIST_CLASSES,
    CachedDataset,
    ImageFolderDataset,
    get_cifar10,
    get_fashion_mnist,
    load_dataset,
    make_loader,
    make_transform,
)
from tinydit.errors import TinyDiTError
from tinydit.images import from_uint8, to_uint8

HAS_FMNIST = fashion_mnist_available()


def _write(path: Path, color, size=(40, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "pics"
    _write(root / "cats" / "a.png", (255, 0, 0))
    _write(root / "cats" / "deep" / "b.jpg", (0, 255, 0))  # nested: its own class "cats/deep"
    _write(root / "dogs" / "c.bmp", (0, 0, 255), size=(64, 64))
    _write(root / "dogs" / "d.png", (255, 255, 255))
    (root / "dogs" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    (root / "notes.txt").write_text("ignored: not an image")
    return root


def test_transform_gives_model_range_and_size():
    img = Image.new("RGB", (50, 40), (255, 0, 0))
    x = make_transform(32, train=False)(img)
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert torch.allclose(x[0], torch.ones(32, 32)) and torch.allclose(x[1], -torch.ones(32, 32))


def test_image_folder_recursive_labels_and_corrupt_file_skipped(folder):
    with pytest.warns(UserWarning, match="broken.png"):
        ds = ImageFolderDataset(folder, img_size=32, train=False)
    assert len(ds) == 4
    assert ds.classes == ["cats", "cats/deep", "dogs"]
    x, y = ds[0]
    assert x.shape == (3, 32, 32) and -1 <= x.min() and x.max() <= 1
    labels = sorted(ds[i][1] for i in range(len(ds)))
    assert labels == [0, 1, 2, 2]
    xb, yb = next(iter(make_loader(ds, batch_size=4, shuffle=False, num_workers=0)))
    assert xb.shape == (4, 3, 32, 32) and yb.dtype == torch.int64


def test_flat_folder_works(tmp_path):
    for i in range(3):
        _write(tmp_path / f"{i}.png", (10 * i, 0, 0))
    ds = ImageFolderDataset(tmp_path)
    assert len(ds) == 3 and ds.classes == ["."]


def test_empty_folder_is_a_clear_error(tmp_path):
    with pytest.raises(TinyDiTError, match="no images found"):
        ImageFolderDataset(tmp_path)
    (tmp_path / "bad.png").write_bytes(b"junk")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TinyDiTError, match="1 unreadable images"):
            ImageFolderDataset(tmp_path)


def test_loader_shuffles_for_training_and_keeps_order_for_eval():
    ds = CachedDataset(
        torch.arange(10, dtype=torch.uint8).view(10, 1, 1, 1).expand(10, 1, 2, 2).clone(), torch.arange(10), ["c"] * 10
    )
    evals = [y.tolist() for _, y in make_loader(ds, batch_size=4, shuffle=False, num_workers=0)]
    assert evals == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    torch.manual_seed(0)
    train = make_loader(ds, batch_size=4, shuffle=True, num_workers=0)
    epochs = [[y.tolist() for _, y in train] for _ in range(3)]
    assert all(len(b) == 2 and all(len(x) == 4 for x in b) for b in epochs)  # ragged batch dropped
    flat = [sum(b, []) for b in epochs]
    assert any(f != sorted(f) for f in flat) and len({tuple(f) for f in flat}) > 1  # shuffled, anew each epoch


def test_cached_dataset_batch_flips_and_ranges():
    img = torch.zeros(1, 3, 4, 4, dtype=torch.uint8)
    img[..., 0] = 255  # left column white
    ds = CachedDataset(img.expand(64, -1, -1, -1).clone(), torch.zeros(64, dtype=torch.long), ["a"], flip=True)
    x, y = ds.batch(torch.arange(64), generator=torch.Generator().manual_seed(0))
    assert x.dtype == torch.float32 and x.min() == -1 and x.max() == 1 and y.shape == (64,)
    left_white = (x[:, 0, 0, 0] == 1).sum().item()
    assert 10 < left_white < 54  # some flipped, some not
    assert torch.equal(x[:, :, :, 0] == 1, x[:, :, :, -1] != 1)
    x2, _ = ds.batch(torch.arange(64), generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)  # flips come from the generator
    # draw_flips is the draw batch makes: passed back, the same images (the trainer keeps the flips)
    flips = ds.draw_flips(64, torch.Generator().manual_seed(0))
    assert torch.equal(ds.batch(torch.arange(64), flips=flips)[0], x)
    assert torch.equal(flips, x[:, 0, 0, -1] == 1)  # True where the white column went right
    still = CachedDataset(img.expand(4, -1, -1, -1).clone(), torch.zeros(4, dtype=torch.long), ["a"], flip=False)
    g = torch.Generator().manual_seed(0)
    assert not still.draw_flips(4, g).any() and torch.equal(g.get_state(), torch.Generator().manual_seed(0).get_state())


def test_cached_image_folder_matches_the_transform_and_splits_disjointly(tmp_path, monkeypatch):
    root = tmp_path / "many"
    for i in range(120):  # enough files for the ~5% hold-out to pick some
        _write(root / f"c{i % 3}" / f"{i:03d}.png", (2 * i, 255 - 2 * i, i), size=(48, 40))
    train, held = load_dataset(str(root), train=True), load_dataset(str(root), train=False)
    assert train.images.dtype == torch.uint8 and train.images.shape[1:] == (3, 32, 32)
    assert train.flip and not held.flip and train.classes == held.classes == ["c0", "c1", "c2"]
    assert len(train) + len(held) == 120 and 0 < len(held) < 20

    def colours(ds):
        return {tuple(ds.images[i, :, 0, 0].tolist()) for i in range(len(ds))}

    assert colours(train).isdisjoint(colours(held))  # no image in both splits
    assert colours(train) | colours(held) == {(2 * i, 255 - 2 * i, i) for i in range(120)}  # all, exactly
    x, _ = ImageFolderDataset(root, train=False)[0]  # the transform's output, quantised, is what is cached
    assert any(torch.equal(to_uint8(x), img) for img in torch.cat([train.images, held.images]))
    monkeypatch.chdir(tmp_path)  # the same folder by another path splits the same way
    assert torch.equal(load_dataset("many", train=False).images, held.images)


def test_tiny_folder_validates_on_training_images_and_says_so(tmp_path):
    for i in range(3):
        _write(tmp_path / f"{i}.png", (10 * i, 0, 0))
    with pytest.warns(UserWarning, match="too small to hold images out"):
        held = load_dataset(str(tmp_path), train=False)
    assert len(held) == 3


def test_unknown_dataset_name_is_a_clear_error():
    with pytest.raises(TinyDiTError, match="unknown data set"):
        load_dataset("imagenet-9000")


def test_cifar10_missing_offline_is_a_clear_error(tmp_path):
    with pytest.raises(TinyDiTError, match="CIFAR-10 is not in"):
        get_cifar10(tmp_path, download=False)


def test_fashion_mnist_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr("tinydit.data.datasets.DEBIAN_FASHION_MNIST", tmp_path / "nowhere")
    with pytest.raises(TinyDiTError, match="Fashion-MNIST is not in"):
        get_fashion_mnist(tmp_path, download=False)


def test_fashion_mnist_reads_idx_files_from_root(tmp_path, monkeypatch):
    import gzip
    import struct

    monkeypatch.setattr("tinydit.data.datasets.DEBIAN_FASHION_MNIST", tmp_path / "nowhere")
    imgs = np.arange(3 * 28 * 28, dtype=np.uint64).astype(np.uint8).reshape(3, 28, 28)
    with gzip.open(tmp_path / "t10k-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">HBB3I", 0, 8, 3, 3, 28, 28) + imgs.tobytes())
    with open(tmp_path / "t10k-labels-idx1-ubyte", "wb") as f:  # uncompressed works too
        f.write(struct.pack(">HBB1I", 0, 8, 1, 3) + bytes([4, 0, 9]))
    ds = get_fashion_mnist(tmp_path, train=False, download=False)
    assert ds.images.shape == (3, 1, 28, 28) and torch.equal(ds.images[:, 0], torch.from_numpy(imgs))
    assert ds.labels.tolist() == [4, 0, 9] and not ds.flip


@pytest.mark.skipif(not HAS_FMNIST, reason="Fashion-MNIST is absent (./data and Debian's dataset-fashion-mnist)")
def test_real_fashion_mnist_shapes_and_balance():
    ds = load_dataset("fashion-mnist", train=False)
    assert len(ds) == 10000 and ds.images.shape == (10000, 1, 28, 28)
    assert ds.classes == FASHION_MNIST_CLASSES
    assert torch.bincount(ds.labels).tolist() == [1000] * 10
    x, y = ds.batch(torch.arange(128))
    assert x.shape == (128, 1, 28, 28) and x.min() >= -1 and x.max() <= 1 and y.dtype == torch.int64


def test_shapes_via_load_dataset_has_captions_and_limit():
    ds = load_dataset("shapes", train=False, limit=50)
    assert len(ds) == 50 and ds.images.shape == (50, 3, 32, 32) and len(ds.captions) == 50
    assert ds.classes == ["circle", "square", "triangle", "cross"]


def write_fashion_mnist(root: Path, n: int = 64) -> None:
    """A small Fashion-MNIST in its idx layout, both splits: images whose left and right halves differ, so a
    mirrored one is never equal to itself."""
    import gzip
    import struct

    rng = np.random.default_rng(0)
    for prefix, count in (("train", n), ("t10k", n // 2)):
        imgs = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
        imgs[:, :, :14] = 0  # every image dark on its left, so its mirror image is dark on its right
        with gzip.open(root / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
            f.write(struct.pack(">HBB3I", 0, 8, 3, count, 28, 28) + imgs.tobytes())
        with gzip.open(root / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(struct.pack(">HBB1I", 0, 8, 1, count) + bytes(i % 10 for i in range(count)))


def mirrored_batches(tmp_path, monkeypatch, **kw) -> tuple[int, int]:
    """(batches, batches holding a mirrored image) of a short Fashion-MNIST run, read where the trainer
    takes each training batch."""
    from tinydit.data.cache import CachedDataset
    from tinydit.train import Trainer

    monkeypatch.setattr("tinydit.data.datasets.DEBIAN_FASHION_MNIST", tmp_path / "nowhere")
    (tmp_path / "fm").mkdir()
    write_fashion_mnist(tmp_path / "fm")
    seen, batch = [], CachedDataset.batch

    def watched(self, indices, generator=None, device="cpu", flips=None):
        x, y = batch(self, indices, generator, device, flips)
        if self.images.shape[0] == 64:  # the training set (the validation set holds 32)
            seen.append(not torch.equal(x, from_uint8(self.images[indices])))
        return x, y

    monkeypatch.setattr(CachedDataset, "batch", watched)
    cfg = fast_config(tmp_path / "run", data="fashion-mnist", data_root=str(tmp_path / "fm"), steps=6, **kw)
    Trainer(cfg, progress=False).fit()
    return len(seen), sum(seen)


def test_a_fashion_mnist_run_never_sees_a_mirrored_image(tmp_path, monkeypatch):
    batches, mirrored = mirrored_batches(tmp_path, monkeypatch)
    assert batches >= 6 and mirrored == 0


def test_flip_on_mirrors_fashion_mnist_where_asked(tmp_path, monkeypatch):
    """The negative control of the test above: the same watch sees mirrored images when flips are on."""
    batches, mirrored = mirrored_batches(tmp_path, monkeypatch, flip=True)
    assert batches >= 6 and mirrored >= batches // 2


def test_whether_a_run_flips_is_the_data_sets_own_unless_given(tmp_path):
    from tinydit.config import TrainConfig
    from tinydit.train.resolve import resolve

    folder = tmp_path / "photos"
    folder.mkdir()
    assert resolve(TrainConfig(data="fashion-mnist")).flip is False
    assert resolve(TrainConfig(data="shapes")).flip is True
    assert resolve(TrainConfig(data="cifar10")).flip is True
    assert resolve(TrainConfig(data=str(folder))).flip is True
    assert resolve(TrainConfig(data=str(folder), flip=False)).flip is False
    assert resolve(TrainConfig(data="fashion-mnist", flip=True)).flip is True
