"""Where a client's private images come from, and how a batch is drawn from them."""

from __future__ import annotations

import ast
import importlib.util
import contextlib
import os
import re
import stat
from abc import ABC, abstractmethod
from functools import cached_property, lru_cache
from pathlib import Path

import torch
from PIL import Image

from gradleak.data import idx
from gradleak.data.batch import Batch
from gradleak.data.images import (
    IMAGE_EXTENSIONS,
    check_geometry,
    is_image_file,
    load_image_file,
    pil_to_tensor,
)
from gradleak.catalog import SOURCES, unknown
from gradleak.errors import ConfigError, DataError
from gradleak.paths import one_line

SOURCE_NAMES: tuple[str, ...] = SOURCES   # the named sources (catalog.py: the CLI checks names without torch)
SPLITS: tuple[str, ...] = ("train", "test")
# Bounds of an ImageFolder walk (ImageNet's training set has 1.28 M files in 1000 folders).
MAX_FOLDER_ENTRIES = 2_000_000
MAX_FOLDERS = 20_000

CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip

# The 100 fine labels in index order (CIFAR-100 "meta" file, fine_label_names).
CIFAR100_CLASSES: tuple[str, ...] = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle",
    "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle",
    "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch",
    "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish", "forest",
    "fox", "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn_mower",
    "leopard", "lion", "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain",
    "mouse", "mushroom", "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear",
    "pickup_truck", "pine_tree", "plain", "plate", "poppy", "porcupine", "possum", "rabbit",
    "raccoon", "ray", "road", "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk",
    "skyscraper", "snail", "snake", "spider", "squirrel", "streetcar", "sunflower",
    "sweet_pepper", "table", "tank", "telephone", "television", "tiger", "tractor", "train",
    "trout", "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
)  # fmt: skip

FASHION_MNIST_CLASSES: tuple[str, ...] = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip

_FOOLBOX_HINT = "install the sample photos with: pip install --no-deps foolbox==3.3.4"
_FASHION_HINT = (
    "`make setup` unpacks them from Debian's dataset-fashion-mnist "
    "(or: apt-get install dataset-fashion-mnist), or pass a folder holding the IDX files (root=DIR or the folder path as the source)"
)


class ImageSource(ABC):
    """A finite, indexable set of labelled images.

    Items are addressed by index 0..len-1 in a fixed (sorted) order, so a seed always
    picks the same images.
    """

    name: str
    num_classes: int
    class_names: tuple[str, ...]
    native_channels: int
    native_size: int  # 0 when images come in varied sizes

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def label(self, i: int) -> int:
        """Class index of item ``i``."""

    @abstractmethod
    def item_name(self, i: int) -> str:
        """Human-readable id of item ``i`` (a file name or ``"train[1234]"``)."""

    @abstractmethod
    def load(self, i: int, image_size: int, channels: int) -> torch.Tensor:
        """Item ``i`` as [channels, image_size, image_size] float32 in [0, 1]."""

    def _check_index(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {self.name} ({n} images)")
        return i % n

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, images={len(self)})"


class FileListSource(ImageSource):
    """Images stored one per file, with labels known up front."""

    def __init__(
        self,
        name: str,
        files: list[Path],
        labels: list[int],
        class_names: tuple[str, ...],
        names: list[str],
    ) -> None:
        self.name = name
        self.class_names = class_names
        self.num_classes = len(class_names)
        self._files = files
        self._labels = labels
        self._names = names

    def __len__(self) -> int:
        return len(self._files)

    def label(self, i: int) -> int:
        return self._labels[self._check_index(i)]

    def item_name(self, i: int) -> str:
        return self._names[self._check_index(i)]

    def path(self, i: int) -> Path:
        """The file behind item ``i``."""
        return self._files[self._check_index(i)]

    def load(self, i: int, image_size: int, channels: int) -> torch.Tensor:
        return load_image_file(self.path(i), image_size, channels)


class SampleSource(FileListSource):
    """The foolbox sample photos of one dataset: ``<prefix>_<NN>_<label>.<ext>``."""

    def __init__(
        self,
        name: str,
        folder: Path,
        prefix: str,
        class_names: tuple[str, ...],
        native_size: int,
    ) -> None:
        pattern = re.compile(rf"{re.escape(prefix)}_(\d+)_(\d+)\.(png|jpe?g)", re.IGNORECASE)
        try:
            entries = sorted(os.listdir(folder))
        except OSError as exc:
            raise DataError(f"cannot list sample folder {one_line(str(folder))}: {one_line(str(exc))}; {_FOOLBOX_HINT}") from None
        files: list[Path] = []
        labels: list[int] = []
        for entry in entries:
            match = pattern.fullmatch(entry)
            if match is None:
                continue
            label = int(match.group(2))
            if label >= len(class_names):
                raise DataError(
                    f"sample file {one_line(str(folder / entry))} has label {label} >= {len(class_names)}"
                )
            files.append(folder / entry)
            labels.append(label)
        if not files:
            raise DataError(f"no {prefix}_NN_L images in {one_line(str(folder))}; {_FOOLBOX_HINT}")
        super().__init__(name, files, labels, class_names, [f.name for f in files])
        self.native_channels = 3
        self.native_size = native_size


_GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "F"})


def _class_dirs(root: Path, shown: str) -> list[str]:
    """The class folders of an ImageFolder ``root``, sorted, hidden ones left out (DataError when
    it cannot be listed or has none)."""
    try:
        class_dirs = sorted(
            e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")
        )
    except OSError as exc:
        raise DataError(f"cannot list folder {shown}: {exc.strerror or exc}") from None
    if not class_dirs:
        loose = any(is_image_file(e) for e in os.listdir(root))
        hint = " (images must sit in one subfolder per class)" if loose else ""
        raise DataError(f"folder {shown} has no class subfolders{hint}")
    return class_dirs


def _walk_class_dirs(root: Path, shown: str,
                     class_dirs: list[str]) -> tuple[list[Path], list[int], list[tuple[str, str]]]:
    """(image files, their class index, (path, why) of what could not be read) under each class
    folder, in sorted order."""
    files: list[Path] = []
    labels: list[int] = []
    # What cannot be read (a folder or an image this user may not read) is never skipped:
    # the data would silently be other data (a class missing, fewer images). It is refused,
    # naming the first such path.
    unreadable: list[tuple[str, str]] = []

    def cannot_read(exc: OSError) -> None:
        unreadable.append((str(exc.filename or root), exc.strerror or str(exc)))

    # Linked folders are followed (a class folder may be a link), but each real folder is
    # entered once, so a symlink loop ends; the walk is bounded (a folder such as / fails
    # fast with one line instead of walking the whole file system).
    visited: set[tuple[int, int]] = set()
    class_roots: dict[tuple[int, int], str] = {}
    for cls in class_dirs:  # a link into another class's folder never relabels its images
        with contextlib.suppress(OSError):
            st = os.stat(root / cls)
            class_roots[(st.st_dev, st.st_ino)] = cls
    seen_entries = 0
    for index, cls in enumerate(class_dirs):
        for dirpath, dirnames, filenames in os.walk(root / cls, followlinks=True, onerror=cannot_read):
            try:
                st = os.stat(dirpath)
            except OSError as exc:
                cannot_read(exc)
                dirnames[:] = []
                continue
            key = (st.st_dev, st.st_ino)
            if key in visited or class_roots.get(key, cls) != cls:
                dirnames[:] = []
                continue
            visited.add(key)
            seen_entries += len(dirnames) + len(filenames)
            if seen_entries > MAX_FOLDER_ENTRIES or len(visited) > MAX_FOLDERS:
                raise DataError(f"folder {shown} holds more than {MAX_FOLDER_ENTRIES} entries or "
                                f"{MAX_FOLDERS} folders; point --data at a folder of images")
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for fname in sorted(filenames):
                if is_image_file(fname) and not fname.startswith("."):
                    path = Path(dirpath) / fname
                    if not os.access(path, os.R_OK):
                        unreadable.append((str(path), "not readable" if os.path.exists(path)
                                           else "a link to nothing"))
                        continue
                    files.append(path)
                    labels.append(index)
    return files, labels, unreadable


class ImageFolderSource(FileListSource):
    """torchvision-style ImageFolder: ``root/<class>/**/<image>``.

    Class index = position of the class folder in sorted order; empty class folders still
    count (torchvision's numbering), hidden ones (".name") are skipped. Images may sit in
    nested folders. Item names are paths relative to ``root``.
    """

    def __init__(self, root: Path, name: str | None = None) -> None:
        shown = one_line(str(root))
        class_dirs = _class_dirs(root, shown)
        files, labels, unreadable = _walk_class_dirs(root, shown, class_dirs)
        if unreadable:
            first, why = unreadable[0]
            more = f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else ""
            raise DataError(f"cannot read {one_line(first)} in image folder {shown}: {why}{more}; the data would "
                            "be missing it: make it readable or move it out of the folder")
        if not files:
            exts = " ".join(sorted(IMAGE_EXTENSIONS))
            raise DataError(f"folder {shown} has class subfolders but no images ({exts})")
        names = [f.relative_to(root).as_posix() for f in files]
        super().__init__(name or str(root), files, labels, tuple(class_dirs), names)
        self.root = root

    @cached_property
    def _native(self) -> tuple[int, int]:
        """(channels, size) from the file headers only (no pixel decoding)."""
        sizes: set[tuple[int, int]] = set()
        grey = True
        for f in self._files:
            try:
                with Image.open(f) as img:  # lazy: parses the header, decodes no pixels
                    sizes.add(img.size)
                    grey = grey and (img.mode in _GREY_MODES or img.mode.startswith("I;16"))
            except PermissionError as exc:  # never a silent guess from the other files
                raise DataError(f"cannot read image {one_line(str(f))}: {exc.strerror or exc}") from None
            except Exception:  # noqa: BLE001 - a broken file is reported when it is loaded
                continue
        (w, h), *others = sorted(sizes) or [(0, 0)]
        size = w if not others and w == h else 0
        return (1 if grey and sizes else 3), size

    @property
    def native_channels(self) -> int:  # type: ignore[override]
        """1 when every image is grayscale, else 3 (reads every file header once)."""
        return self._native[0]

    @property
    def native_size(self) -> int:  # type: ignore[override]
        """The common side when all images are the same square size, else 0."""
        return self._native[1]


class FashionMNISTSource(ImageSource):
    """Fashion-MNIST from IDX files; only the images asked for are turned into tensors."""

    native_channels = 1
    class_names = FASHION_MNIST_CLASSES
    num_classes = len(FASHION_MNIST_CLASSES)

    def __init__(self, root: Path, split: str = "train", name: str = "fashion-mnist") -> None:
        pair = idx.find_idx_pair(root, split)
        if pair is None:
            stems = " and ".join(f"{s}[.gz]" for s in idx.idx_file_names(split))
            raise DataError(
                f"no Fashion-MNIST {split} split in {one_line(str(root))} (looked for {stems}, also under "
                f"FashionMNIST/raw); {_FASHION_HINT}"
            )
        self.name = name
        self.split = split
        self.root = root
        self.images_path, self.labels_path = pair
        images, labels = idx.load_idx_pair(*pair)
        self._images = images  # [N, H, W] uint8, read-only
        self._labels = labels  # [N] uint8
        h, w = images.shape[1:]
        self.native_size = h if h == w else 0

    def __len__(self) -> int:
        return int(self._images.shape[0])

    def label(self, i: int) -> int:
        return int(self._labels[self._check_index(i)])

    def item_name(self, i: int) -> str:
        return f"{self.split}[{self._check_index(i)}]"

    def load(self, i: int, image_size: int, channels: int) -> torch.Tensor:
        check_geometry(image_size, channels)
        pixels = self._images[self._check_index(i)]
        return pil_to_tensor(Image.fromarray(pixels, "L"), image_size, channels)


# ---------------------------------------------------------------------------------------
# Opening sources by name or path


def foolbox_data_dir() -> Path:
    """``foolbox/data`` of the installed wheel, located without importing foolbox.

    Importing foolbox needs eagerpy; we only want its bundled photos.
    """
    try:
        spec = importlib.util.find_spec("foolbox")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise DataError(f"the foolbox sample photos are not installed; {_FOOLBOX_HINT}")
    folder = Path(locations[0]) / "data"
    if not folder.is_dir():
        raise DataError(f"foolbox is installed but {one_line(str(folder))} is missing; {_FOOLBOX_HINT}")
    return folder


@lru_cache(maxsize=1)
def imagenet_class_names() -> tuple[str, ...]:
    """The 1000 ImageNet class names, read offline from torchvision's source when present.

    torchvision keeps them as a literal list in ``torchvision/models/_meta.py``; parsing that
    file avoids a ~1 s torchvision import. Falls back to "class 243" style names.
    """
    fallback = tuple(f"class {k}" for k in range(1000))
    try:
        spec = importlib.util.find_spec("torchvision")
        if spec is None or not spec.submodule_search_locations:
            return fallback
        meta = Path(spec.submodule_search_locations[0]) / "models" / "_meta.py"
        tree = ast.parse(meta.read_text(encoding="utf-8"))
    except (ImportError, ValueError, OSError, SyntaxError):
        return fallback
    for node in tree.body:
        targets = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        if isinstance(node, ast.Assign) and "_IMAGENET_CATEGORIES" in targets:
            try:
                names = ast.literal_eval(node.value)
            except ValueError:
                return fallback
            if isinstance(names, list) and len(names) == 1000:
                if all(isinstance(n, str) for n in names):
                    return tuple(names)
    return fallback


def _open_samples(name: str, root: Path | None) -> SampleSource:
    folder = root if root is not None else foolbox_data_dir()
    if name == "cifar10-samples":
        return SampleSource(name, folder, "cifar10", CIFAR10_CLASSES, 32)
    if name == "cifar100-samples":
        return SampleSource(name, folder, "cifar100", CIFAR100_CLASSES, 32)
    # ImageNet photos vary in size (512x512, one 1024x683); 224 is the nominal model input.
    return SampleSource(name, folder, "imagenet", imagenet_class_names(), 224)


def _looks_like_path(text: str) -> bool:
    return "/" in text or "." in text or os.sep in text or text.startswith("~")


def open_source(
    name_or_path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    split: str = "train",
) -> ImageSource:
    """Open a data source by name (see :data:`SOURCE_NAMES`) or by folder path.

    root:  overrides the folder of a named source (the IDX folder for ``fashion-mnist``,
           the folder holding the sample photos for the ``*-samples`` sources).
    split: "train" or "test"; only Fashion-MNIST (IDX) sources have splits: "test" for another
    source is an error (it would be ignored).
    """
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    source = _open(name_or_path, root, split)
    if split != "train" and not isinstance(source, FashionMNISTSource):
        raise ConfigError(f"--split {split} applies to Fashion-MNIST (IDX) sources, not to {one_line(str(source.name))}")
    return source


def _open(name_or_path: str | os.PathLike[str], root: str | os.PathLike[str] | None, split: str) -> ImageSource:
    for given, what in ((root, "root"), (name_or_path, "data source")):
        if given is not None and "\0" in os.fspath(given):
            raise DataError(f"{what} {one_line(os.fspath(given))} holds a NUL byte; no folder has such a name")
    root_path = Path(root).expanduser() if root is not None else None
    if root_path is not None and not _is_dir(root_path):
        raise DataError(f"no such folder: {one_line(str(root_path))} (given as root)")
    text = os.fspath(name_or_path)
    shown = one_line(text)
    key = text.strip().lower()
    if key in SOURCE_NAMES:
        if key == "fashion-mnist":
            found = root_path or idx.find_default_root(split)
            if found is None:
                where = ", ".join(str(r) for r in idx.default_roots())
                raise DataError(f"Fashion-MNIST ({split}) not found in {where}; {_FASHION_HINT}")
            return FashionMNISTSource(found, split)
        return _open_samples(key, root_path)

    path = Path(text).expanduser()
    if _is_dir(path):
        if idx.has_idx_files(path):
            return FashionMNISTSource(path, split, name=text)
        return ImageFolderSource(path, name=text)
    if os.path.exists(path):
        raise DataError(f"{shown} is a file, not a folder of images or a known source name")
    if _looks_like_path(text):
        raise DataError(f"no such folder: {shown}")
    raise unknown("data source", text, SOURCE_NAMES, ", or a path to an image folder")


def _is_dir(path: Path) -> bool:
    """``path.is_dir()``, with a folder above it that cannot be searched a DataError naming it
    (pathlib raises PermissionError there)."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except PermissionError as exc:
        raise DataError(f"cannot read {one_line(str(exc.filename or path))}: {exc.strerror or exc}") from None
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------------------------------
# Drawing a batch


def sample_batch(
    source: ImageSource,
    batch_size: int,
    seed: int,
    image_size: int,
    channels: int,
    allow_repeats: bool = False,
    clients: int = 1,
) -> Batch:
    """Draw a reproducible batch of ``batch_size`` images from ``source``: ``clients`` client
    batches of ``batch_size / clients`` each, one after the other (an aggregate's clients).

    Walks ``torch.randperm(len(source))`` seeded with ``seed``; each client takes, in that order,
    items no earlier client took, and unless ``allow_repeats`` skips items whose label it already
    holds, so labels are distinct within each client (the setting where label-restoration
    attacks like iDLG are exact) and may repeat across clients, as in a real federation. One
    client is the plain distinct-label draw; with ``allow_repeats`` the batch is the first
    ``batch_size`` items of the walk whatever ``clients`` is.

    Returns a Batch with images [K, channels, image_size, image_size] float32 in [0, 1]
    and labels [K] int64, in the order drawn (client by client). Only the K chosen images are decoded.
    """
    check_geometry(image_size, channels)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise DataError(f"batch size must be a positive integer, got {batch_size!r}")
    if isinstance(clients, bool) or not isinstance(clients, int) or clients < 1 or batch_size % clients:
        raise DataError(f"a batch of {batch_size} cannot be split evenly over {clients!r} clients")
    n = len(source)
    if n < batch_size:
        raise DataError(f"batch of {batch_size} asked but {one_line(str(source.name))} has only {n} images")

    generator = torch.Generator().manual_seed(int(seed))
    order = torch.randperm(n, generator=generator).tolist()
    per_client = batch_size // clients
    chosen: list[int] = []
    for client in range(clients):
        picked, seen = _client_draw(source, order, set(chosen), per_client, allow_repeats)
        if len(picked) < per_client:
            # The walk covered every item left, so `seen` is every class they hold.
            whose = "" if clients == 1 else f" for client {client + 1} of {clients}"
            left = "" if clients == 1 else " left"
            raise DataError(
                f"batch of {per_client} with distinct labels asked{whose} but {one_line(str(source.name))} has "
                f"only {len(seen)} distinct classes{left}; use --allow-repeats to allow repeated labels"
            )
        chosen += picked
    return batch_of(source, chosen, image_size, channels)


def _client_draw(source: ImageSource, order: list[int], taken: set[int], k: int,
                 allow_repeats: bool) -> tuple[list[int], set[int]]:
    """One client's ``k`` items: the first of ``order`` not in ``taken`` (and, unless
    ``allow_repeats``, whose label the client does not hold yet); with the labels it saw."""
    picked: list[int] = []
    seen: set[int] = set()
    for i in order:
        if i in taken:
            continue
        label = source.label(i)
        if not allow_repeats and label in seen:
            continue
        picked.append(i)
        seen.add(label)
        if len(picked) == k:
            break
    return picked, seen


def batch_of(source: ImageSource, indices: list[int], image_size: int, channels: int) -> Batch:
    """The items ``indices`` of ``source``, in this order, as a Batch (only they are decoded)."""
    check_geometry(image_size, channels)
    n = len(source)
    bad = [i for i in indices if not 0 <= int(i) < n]
    if not indices or bad:
        raise DataError(f"item {bad[0]} is not in {one_line(str(source.name))} (0..{n - 1})" if bad else "no items asked for")
    images = torch.stack([source.load(int(i), image_size, channels) for i in indices])
    labels = torch.tensor([source.label(int(i)) for i in indices], dtype=torch.int64)
    return Batch(
        images=images,
        labels=labels,
        names=tuple(source.item_name(int(i)) for i in indices),
        source=source.name,
        class_names=tuple(source.class_names),
    )
