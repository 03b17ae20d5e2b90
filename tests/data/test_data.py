"""gradleak.data: offline sources, image decoding, IDX parsing, reproducible batches."""

from __future__ import annotations

import gzip
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gradleak.data import (
    CIFAR10_CLASSES,
    CIFAR100_CLASSES,
    FASHION_MNIST_CLASSES,
    SOURCE_NAMES,
    Batch,
    FashionMNISTSource,
    ImageFolderSource,
    load_image_file,
    open_source,
    sample_batch,
)
from gradleak.data.sources import foolbox_data_dir
from gradleak.errors import ConfigError, DataError, GradleakError, UnknownNameError

from conftest import idx_bytes  # tests/ is on sys.path (no package)


def _in_unit_range(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and float(t.min()) >= 0.0 and float(t.max()) <= 1.0


# --- foolbox sample photos ---------------------------------------------------------------


def test_source_names() -> None:
    assert SOURCE_NAMES == (
        "cifar10-samples",
        "cifar100-samples",
        "imagenet-samples",
        "fashion-mnist",
    )


def test_cifar10_samples_labels_from_file_names_and_shapes() -> None:
    src = open_source("cifar10-samples")
    assert len(src) == 20
    assert (src.num_classes, src.native_channels, src.native_size) == (10, 3, 32)
    assert src.class_names == CIFAR10_CLASSES
    assert src.class_names[0] == "airplane" and src.class_names[9] == "truck"
    names = [src.item_name(i) for i in range(len(src))]
    assert names == sorted(names)
    for i in range(len(src)):
        match = re.fullmatch(r"cifar10_(\d\d)_(\d)\.png", src.item_name(i))
        assert match is not None, src.item_name(i)
        assert src.label(i) == int(match.group(2))
        img = src.load(i, 32, 3)
        assert img.shape == (3, 32, 32)
        assert _in_unit_range(img)
        assert float(img.std()) > 0.02  # a real photo, not a blank
    # The first sample is a cat (cifar10_00_3.png).
    assert src.class_names[src.label(0)] == "cat"


def test_cifar10_sample_matches_file_pixels_exactly() -> None:
    src = open_source("cifar10-samples")
    raw = np.asarray(Image.open(foolbox_data_dir() / src.item_name(0)).convert("RGB"))
    expected = torch.from_numpy(raw.copy()).permute(2, 0, 1).float() / 255.0
    assert torch.equal(src.load(0, 32, 3), expected)  # 32 -> 32 is a no-op, no resampling


def test_cifar100_and_imagenet_samples() -> None:
    c100 = open_source("cifar100-samples")
    assert (len(c100), c100.num_classes) == (20, 100)
    assert len(CIFAR100_CLASSES) == 100 and len(set(CIFAR100_CLASSES)) == 100
    assert CIFAR100_CLASSES[0] == "apple" and CIFAR100_CLASSES[99] == "worm"
    # cifar100_00_49.png must not be mistaken for a CIFAR-10 file, and vice versa.
    assert all(c100.item_name(i).startswith("cifar100_") for i in range(20))
    assert c100.label(0) == 49 and c100.class_names[49] == "mountain"

    imnet = open_source("imagenet-samples")
    assert (len(imnet), imnet.num_classes, len(imnet.class_names)) == (20, 1000, 1000)
    assert imnet.native_size == 224
    labels = [imnet.label(i) for i in range(20)]
    assert labels[0] == 243 and labels[6] == labels[7] == 609
    assert len(set(labels)) == 19


def test_imagenet_resize_and_centre_crop() -> None:
    src = open_source("imagenet-samples")
    wide = next(i for i in range(len(src)) if src.item_name(i) == "imagenet_10_541.jpg")
    with Image.open(foolbox_data_dir() / "imagenet_10_541.jpg") as im:
        assert im.size == (1024, 683)  # the one non-square photo
    for size in (32, 224):
        for i in (0, wide):
            img = src.load(i, size, 3)
            assert img.shape == (3, size, size)
            assert _in_unit_range(img)
    gray = src.load(0, 224, 1)
    assert gray.shape == (1, 224, 224) and _in_unit_range(gray)


def test_centre_crop_keeps_the_middle(tmp_path: Path) -> None:
    # 30x10 image: left third red, middle third green, right third blue.
    arr = np.zeros((10, 30, 3), np.uint8)
    arr[:, :10, 0] = arr[:, 10:20, 1] = arr[:, 20:, 2] = 255
    Image.fromarray(arr).save(tmp_path / "wide.png")
    out = load_image_file(tmp_path / "wide.png", 10, 3)
    assert out.shape == (3, 10, 10)
    assert torch.allclose(out[:, 5, 5], torch.tensor([0.0, 1.0, 0.0]), atol=0.02)


# --- sampling ---------------------------------------------------------------------------


def test_sample_batch_reproducible_and_distinct_labels() -> None:
    src = open_source("cifar10-samples")
    a = sample_batch(src, 4, seed=0, image_size=32, channels=3)
    b = sample_batch(src, 4, seed=0, image_size=32, channels=3)
    c = sample_batch(src, 4, seed=1, image_size=32, channels=3)
    assert isinstance(a, Batch)
    assert a.images.shape == (4, 3, 32, 32) and a.images.dtype == torch.float32
    assert a.labels.dtype == torch.int64 and a.labels.shape == (4,)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert a.names == b.names
    assert a.names != c.names
    assert len(set(a.labels.tolist())) == 4
    assert a.source == "cifar10-samples" and a.class_names == CIFAR10_CLASSES
    # Each image in the batch is the file it is named after.
    for k, name in enumerate(a.names):
        i = next(j for j in range(len(src)) if src.item_name(j) == name)
        assert torch.equal(a.images[k], src.load(i, 32, 3))
        assert int(a.labels[k]) == src.label(i)


def test_distinct_labels_limit_and_allow_repeats() -> None:
    src = open_source("imagenet-samples")
    with pytest.raises(DataError, match=r"19 distinct classes.*--allow-repeats"):
        sample_batch(src, 20, seed=0, image_size=8, channels=3)
    batch = sample_batch(src, 20, seed=0, image_size=8, channels=3, allow_repeats=True)
    assert batch.images.shape == (20, 3, 8, 8)
    assert sorted(batch.names) == [src.item_name(i) for i in range(20)]
    assert batch.labels.tolist().count(609) == 2
    # 19 distinct labels is the most one can get without repeats.
    assert len(set(sample_batch(src, 19, seed=3, image_size=8, channels=3).labels.tolist())) == 19


def test_sample_batch_errors() -> None:
    src = open_source("cifar10-samples")
    with pytest.raises(DataError, match="only 20 images"):
        sample_batch(src, 21, seed=0, image_size=32, channels=3, allow_repeats=True)
    # The 20 CIFAR-10 samples cover 8 classes: no bird (2) and no deer (4).
    assert sorted({src.label(i) for i in range(len(src))}) == [0, 1, 3, 5, 6, 7, 8, 9]
    assert sample_batch(src, 8, seed=0, image_size=32, channels=3).labels.unique().numel() == 8
    with pytest.raises(DataError, match="only 8 distinct classes"):
        sample_batch(src, 9, seed=0, image_size=32, channels=3)
    with pytest.raises(DataError):
        sample_batch(src, 0, seed=0, image_size=32, channels=3)
    with pytest.raises(ConfigError):
        sample_batch(src, 2, seed=0, image_size=32, channels=2)
    with pytest.raises(ConfigError):
        sample_batch(src, 2, seed=0, image_size=0, channels=3)


def test_grayscale_rgb_conversion(tmp_path: Path) -> None:
    src = open_source("cifar10-samples")
    rgb = src.load(0, 32, 3)
    gray = src.load(0, 32, 1)
    assert gray.shape == (1, 32, 32)
    # PIL's "L" is ITU-R 601 luma of the RGB pixels.
    luma = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]
    assert torch.allclose(gray[0], luma, atol=1.5 / 255)
    # Grayscale -> 3 channels repeats the one channel.
    Image.fromarray((np.arange(64, dtype=np.uint8) * 4).reshape(8, 8), "L").save(tmp_path / "g.png")
    three = load_image_file(tmp_path / "g.png", 8, 3)
    assert three.shape == (3, 8, 8)
    assert torch.equal(three[0], three[1]) and torch.equal(three[1], three[2])
    assert torch.allclose(three[0, 0, :2], torch.tensor([0.0, 4 / 255]))


# --- ImageFolder ------------------------------------------------------------------------


def _make_image_folder(root: Path) -> None:
    rng = np.random.default_rng(0)
    for cls in ("zebra", "apple", "mango"):
        (root / cls).mkdir(parents=True)
    rgb = rng.integers(0, 256, (12, 20, 3), dtype=np.uint8)
    Image.fromarray(rgb).convert("P").save(root / "zebra" / "b_palette.png")
    rgba = np.dstack([rgb, np.full((12, 20), 128, np.uint8)])
    Image.fromarray(rgba, "RGBA").save(root / "zebra" / "a_rgba.PNG")
    Image.fromarray(rgb[..., 0], "L").save(root / "apple" / "gray.png")
    sixteen = (np.arange(100, dtype=np.uint16).reshape(10, 10) * 650).astype(np.uint16)
    Image.fromarray(sixteen).save(root / "mango" / "deep.png")  # mode I;16
    Image.fromarray(rgb).save(root / "mango" / "photo.jpg")
    (root / "mango" / "notes.txt").write_text("not an image")


def test_image_folder_classes_are_sorted_positions(tmp_path: Path) -> None:
    _make_image_folder(tmp_path)
    src = open_source(str(tmp_path))
    assert isinstance(src, ImageFolderSource)
    assert src.class_names == ("apple", "mango", "zebra")
    assert src.num_classes == 3 and src.name == str(tmp_path)
    items = {src.item_name(i): src.label(i) for i in range(len(src))}
    assert items == {
        "apple/gray.png": 0,
        "mango/deep.png": 1,
        "mango/photo.jpg": 1,
        "zebra/a_rgba.PNG": 2,
        "zebra/b_palette.png": 2,
    }
    assert src.native_size == 0 and src.native_channels == 3  # mixed sizes and modes
    for i in range(len(src)):
        for channels in (1, 3):
            img = src.load(i, 16, channels)
            assert img.shape == (channels, 16, 16) and _in_unit_range(img)
    batch = sample_batch(src, 3, seed=0, image_size=16, channels=3)
    assert sorted(batch.labels.tolist()) == [0, 1, 2]


def test_odd_modes_convert_sensibly(tmp_path: Path) -> None:
    # 16-bit: scaled by the bit depth (PIL's own convert("L") would clip to white).
    sixteen = np.full((4, 4), 32768, np.uint16)
    Image.fromarray(sixteen).save(tmp_path / "deep.png")
    with Image.open(tmp_path / "deep.png") as im:
        assert im.mode.startswith("I")
    half = load_image_file(tmp_path / "deep.png", 4, 1)
    assert torch.allclose(half, torch.full((1, 4, 4), 0.5), atol=1 / 255)
    # Fully transparent pixels composite onto white.
    clear = np.zeros((4, 4, 4), np.uint8)
    Image.fromarray(clear, "RGBA").save(tmp_path / "clear.png")
    assert torch.equal(load_image_file(tmp_path / "clear.png", 4, 3), torch.ones(3, 4, 4))
    # 1-bit and CMYK decode too.
    Image.new("1", (5, 5), 1).save(tmp_path / "bit.png")
    assert torch.equal(load_image_file(tmp_path / "bit.png", 5, 1), torch.ones(1, 5, 5))
    Image.new("CMYK", (6, 6), (0, 0, 0, 0)).save(tmp_path / "cmyk.tif")
    assert torch.allclose(load_image_file(tmp_path / "cmyk.tif", 6, 3), torch.ones(3, 6, 6))


def test_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no class subfolders"):
        open_source(str(tmp_path))
    (tmp_path / "loose.png").write_bytes(b"")
    with pytest.raises(DataError, match="one subfolder per class"):
        open_source(str(tmp_path))
    (tmp_path / "cls").mkdir()
    (tmp_path / "cls" / "readme.txt").write_text("x")
    with pytest.raises(DataError, match="no images"):
        open_source(str(tmp_path))
    with pytest.raises(DataError, match="no such folder"):
        open_source(str(tmp_path / "missing"))
    with pytest.raises(DataError, match="no such folder"):
        open_source("./not-here")
    with pytest.raises(UnknownNameError) as err:
        open_source("cifar11-samples")
    assert "cifar10-samples" in str(err.value) and isinstance(err.value, GradleakError)
    with pytest.raises(DataError, match="not a folder"):
        open_source(str(tmp_path / "cls" / "readme.txt"))
    with pytest.raises(ConfigError):
        open_source("cifar10-samples", split="validation")


def test_corrupt_image_file(tmp_path: Path) -> None:
    good = tmp_path / "c" / "good.png"
    good.parent.mkdir()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(good)
    bad = tmp_path / "c" / "bad.png"
    bad.write_bytes(b"this is not a png at all")
    truncated = tmp_path / "c" / "cut.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(
        tmp_path / "full.png"
    )
    truncated.write_bytes((tmp_path / "full.png").read_bytes()[:200])
    for path in (bad, truncated):
        with pytest.raises(DataError, match=re.escape(path.name)):
            load_image_file(path, 8, 3)
    with pytest.raises(DataError, match="not found"):
        load_image_file(tmp_path / "nope.png", 8, 3)
    src = open_source(str(tmp_path))
    i = next(i for i in range(len(src)) if src.item_name(i) == "c/bad.png")
    with pytest.raises(DataError, match="bad.png"):
        src.load(i, 8, 3)


def test_decompression_bomb_is_a_data_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Image.new("L", (64, 64)).save(tmp_path / "big.png")
    # PIL errors at twice MAX_IMAGE_PIXELS; shrink the limit instead of writing a huge file.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(DataError, match="too large"):
        load_image_file(tmp_path / "big.png", 8, 1)


# --- Fashion-MNIST IDX -------------------------------------------------------------------


def _write_idx_pair(
    folder: Path, split_prefix: str, n: int, gz: bool, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Write a valid IDX pair (images [n, 28, 28], labels k % 10); return the arrays."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    for stem, magic, arr in (
        (f"{split_prefix}-images-idx3-ubyte", 2051, images),
        (f"{split_prefix}-labels-idx1-ubyte", 2049, labels),
    ):
        data = idx_bytes(magic, arr)
        if gz:
            (folder / f"{stem}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / stem).write_bytes(data)
    return images, labels


@pytest.mark.parametrize("gz", [True, False])
def test_tiny_idx_pair_loads(tmp_path: Path, gz: bool) -> None:
    images, labels = _write_idx_pair(tmp_path, "train", 12, gz)
    t_images, t_labels = _write_idx_pair(tmp_path, "t10k", 5, gz, seed=1)
    src = open_source(str(tmp_path))  # detected as Fashion-MNIST, not an ImageFolder
    assert isinstance(src, FashionMNISTSource)
    assert len(src) == 12 and src.native_size == 28 and src.native_channels == 1
    assert src.class_names == FASHION_MNIST_CLASSES and src.num_classes == 10
    assert [src.label(i) for i in range(12)] == labels.tolist()
    assert src.item_name(3) == "train[3]"
    img = src.load(3, 28, 1)
    assert torch.equal(img[0], torch.from_numpy(images[3]).float() / 255.0)
    assert src.load(3, 32, 3).shape == (3, 32, 32)

    test = open_source("fashion-mnist", root=str(tmp_path), split="test")
    assert len(test) == 5 and test.name == "fashion-mnist" and test.item_name(0) == "test[0]"
    assert torch.equal(test.load(4, 28, 1)[0], torch.from_numpy(t_images[4]).float() / 255.0)

    batch = sample_batch(src, 10, seed=0, image_size=28, channels=1)
    assert sorted(batch.labels.tolist()) == list(range(10))
    with pytest.raises(DataError, match="10 distinct classes"):
        sample_batch(src, 11, seed=0, image_size=28, channels=1)


def test_torchvision_raw_layout(tmp_path: Path) -> None:
    _write_idx_pair(tmp_path / "FashionMNIST" / "raw", "train", 7, gz=False)
    by_path = open_source(str(tmp_path))
    by_root = open_source("fashion-mnist", root=tmp_path)
    assert isinstance(by_path, FashionMNISTSource) and len(by_path) == len(by_root) == 7
    with pytest.raises(DataError, match="no Fashion-MNIST test split"):
        open_source(str(tmp_path), split="test")


def test_truncated_and_corrupt_idx(tmp_path: Path) -> None:
    _write_idx_pair(tmp_path / "cut", "train", 6, gz=False)
    path = tmp_path / "cut" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte is truncated"):
        open_source(str(tmp_path / "cut"))

    _write_idx_pair(tmp_path / "magic", "train", 6, gz=False)
    path = tmp_path / "magic" / "train-labels-idx1-ubyte"
    path.write_bytes(struct.pack(">I", 2051) + path.read_bytes()[4:])
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte has magic number 2051"):
        open_source(str(tmp_path / "magic"))

    # A header claiming 4 billion images must be rejected, not allocated.
    _write_idx_pair(tmp_path / "huge", "train", 2, gz=False)
    path = tmp_path / "huge" / "train-images-idx3-ubyte"
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack(">I", 0xFFFFFFFF)
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="truncated"):
        open_source(str(tmp_path / "huge"))

    _write_idx_pair(tmp_path / "gzcut", "train", 6, gz=True)
    path = tmp_path / "gzcut" / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz"):
        open_source(str(tmp_path / "gzcut"))

    _write_idx_pair(tmp_path / "count", "train", 6, gz=False)
    labels_path = tmp_path / "count" / "train-labels-idx1-ubyte"
    labels_path.write_bytes(idx_bytes(2049, np.zeros(5, np.uint8)))
    with pytest.raises(DataError, match="5 labels but"):
        open_source(str(tmp_path / "count"))

    _write_idx_pair(tmp_path / "label", "train", 6, gz=False)
    labels_path = tmp_path / "label" / "train-labels-idx1-ubyte"
    labels_path.write_bytes(idx_bytes(2049, np.full(6, 10, np.uint8)))
    with pytest.raises(DataError, match="label 10"):
        open_source(str(tmp_path / "label"))


def test_rewritten_idx_file_is_not_served_from_cache(tmp_path: Path) -> None:
    _write_idx_pair(tmp_path, "train", 4, gz=False)
    assert len(open_source(str(tmp_path))) == 4
    _write_idx_pair(tmp_path, "train", 9, gz=False)
    assert len(open_source(str(tmp_path))) == 9


def test_real_fashion_mnist() -> None:
    train = open_source("fashion-mnist")
    test = open_source("fashion-mnist", split="test")
    assert (len(train), len(test)) == (60000, 10000)
    assert train.native_size == 28 and train.native_channels == 1
    counts = np.bincount([train.label(i) for i in range(len(train))], minlength=10)
    assert counts.tolist() == [6000] * 10  # Fashion-MNIST is exactly balanced
    img = train.load(0, 28, 1)
    assert img.shape == (1, 28, 28) and _in_unit_range(img) and float(img.max()) > 0.5
    assert train.class_names[train.label(0)] == "Ankle boot"  # the well-known first item
    batch = sample_batch(test, 8, seed=0, image_size=28, channels=1)
    assert batch.images.shape == (8, 1, 28, 28) and len(set(batch.labels.tolist())) == 8
    assert all(name.startswith("test[") for name in batch.names)


def test_missing_installs_give_one_line_hints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from gradleak.data import idx

    real_find_spec = importlib.util.find_spec

    def no_foolbox(name: str, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        return None if name == "foolbox" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", no_foolbox)
    with pytest.raises(DataError, match=r"pip install --no-deps foolbox==3\.3\.4"):
        open_source("cifar10-samples")
    monkeypatch.setattr(idx, "default_roots", lambda: (tmp_path / "absent",))
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        open_source("fashion-mnist")


def test_fashion_mnist_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$GRADLEAK_FASHION_MNIST first, then the environment's copy (make setup), then Debian's
    folder; a folder counts only when it holds the split's files (an empty one is passed over)."""
    import sys

    from gradleak.data import idx

    monkeypatch.setenv(idx.ENV_VAR, str(tmp_path / "mine"))
    roots = idx.default_roots()
    assert roots[0] == tmp_path / "mine"
    assert roots[1] == Path(sys.prefix) / "share" / "gradleak" / "fashion-mnist"
    assert roots[2] == idx.SYSTEM_ROOT
    (tmp_path / "mine").mkdir()  # empty: not chosen
    assert idx.find_default_root("train") != tmp_path / "mine"
    _write_idx_pair(tmp_path / "mine", "t10k", 3, gz=True)
    assert idx.find_default_root("test") == tmp_path / "mine"
    assert len(open_source("fashion-mnist", split="test")) == 3
