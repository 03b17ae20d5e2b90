"""Fashion-MNIST IDX files: find them, validate them, decode them with numpy. No header is trusted
before it is checked against the bytes present, so a corrupt file cannot make us over-allocate."""

from __future__ import annotations

import gzip
import os
import stat
import sys
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np

from gradleak.errors import DataError
from gradleak.paths import one_line

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049
NUM_CLASSES = 10
# Where `fashion-mnist` is looked for, in order: $GRADLEAK_FASHION_MNIST, the copy `make setup`
# unpacks from Debian's package into the environment (scripts/provision.sh), the package's own
# install location. The first folder holding the split's files wins (files, not dpkg records).
SYSTEM_ROOT = Path("/usr/share/datasets/fashion-mnist")
ENV_VAR = "GRADLEAK_FASHION_MNIST"


def default_roots() -> tuple[Path, ...]:
    """The folders searched for ``fashion-mnist`` when no root is given, in order."""
    roots = [Path(sys.prefix) / "share" / "gradleak" / "fashion-mnist", SYSTEM_ROOT]
    if os.environ.get(ENV_VAR):
        roots.insert(0, Path(os.environ[ENV_VAR]).expanduser())
    return tuple(roots)


def find_default_root(split: str) -> Path | None:
    """The first of :func:`default_roots` that holds ``split``'s IDX files, or None."""
    return next((r for r in default_roots() if find_idx_pair(r, split) is not None), None)

# "test" is t10k in the original file names.
_SPLIT_PREFIX = {"train": "train", "test": "t10k"}
_READ_CHUNK = 1 << 20
# A gzip file can expand without bound; Fashion-MNIST's largest file is 47 MB unpacked.
_MAX_UNPACKED = 1 << 30


def idx_file_names(split: str) -> tuple[str, str]:
    """(images, labels) file stems for a split, without ".gz"."""
    prefix = _SPLIT_PREFIX[split]
    return f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"


def candidate_dirs(root: Path) -> tuple[Path, ...]:
    """Folders that may hold the IDX files: root itself, or torchvision's raw layout."""
    return (root, root / "FashionMNIST" / "raw")


def _existing(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        candidate = folder / name
        try:
            if stat.S_ISREG(os.stat(candidate).st_mode):
                return candidate
        except PermissionError as exc:  # a folder that cannot be searched: never "no such file"
            raise DataError(f"cannot look into folder {one_line(str(folder))} for the IDX files: "
                            f"{exc.strerror or exc}") from None
        except (OSError, ValueError):
            continue
    return None


def find_idx_pair(root: Path, split: str) -> tuple[Path, Path] | None:
    """The (images, labels) files of ``split`` under ``root``, or None when absent."""
    images_stem, labels_stem = idx_file_names(split)
    for folder in candidate_dirs(root):
        images, labels = _existing(folder, images_stem), _existing(folder, labels_stem)
        if images is not None and labels is not None:
            return images, labels
    return None


def has_idx_files(root: Path) -> bool:
    """True when ``root`` holds any Fashion-MNIST IDX file (either split, either layout)."""
    stems = [stem for split in _SPLIT_PREFIX for stem in idx_file_names(split)]
    return any(_existing(folder, stem) for folder in candidate_dirs(root) for stem in stems)


def _read_bytes(path: Path) -> bytes:
    """The (decompressed) content of ``path``; DataError for unreadable or broken gzip."""
    try:
        if path.suffix != ".gz":
            return path.read_bytes()
        out = bytearray()
        with gzip.open(path, "rb") as fh:
            # Chunked: a single read(n) would pre-allocate n bytes.
            while chunk := fh.read(_READ_CHUNK):
                out += chunk
                if len(out) > _MAX_UNPACKED:
                    raise DataError(f"IDX file {one_line(str(path))} unpacks to more than {_MAX_UNPACKED} bytes")
        return bytes(out)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise DataError(f"IDX file {one_line(str(path))} is a truncated or corrupt gzip file: {one_line(str(exc))}") from None
    except OSError as exc:
        raise DataError(f"cannot read IDX file {one_line(str(path))}: {one_line(str(exc))}") from None


def parse_idx(data: bytes, expected_magic: int, source: str) -> np.ndarray:
    """Validate an IDX buffer and view it as a uint8 array of the header's shape.

    ``source`` names the file in error messages.
    """
    if len(data) < 4:
        raise DataError(f"IDX file {one_line(str(source))} is truncated: {len(data)} bytes, no header")
    magic = int.from_bytes(data[:4], "big")
    if magic != expected_magic:
        kind = "images" if expected_magic == IMAGES_MAGIC else "labels"
        raise DataError(
            f"IDX file {one_line(str(source))} has magic number {magic}, expected {expected_magic} ({kind}); "
            "not a Fashion-MNIST file or corrupt"
        )
    ndim = data[3]
    expected_ndim = 3 if expected_magic == IMAGES_MAGIC else 1
    if ndim != expected_ndim:
        raise DataError(f"IDX file {one_line(str(source))} has {ndim} dimensions, expected {expected_ndim}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"IDX file {one_line(str(source))} is truncated inside its header")
    dims = tuple(int.from_bytes(data[4 + 4 * k : 8 + 4 * k], "big") for k in range(ndim))
    if any(d == 0 for d in dims):
        raise DataError(f"IDX file {one_line(str(source))} declares an empty shape {dims}")
    # Python ints: no overflow, and we compare before any allocation.
    want = int(np.prod(dims, dtype=object))
    have = len(data) - header
    if have != want:
        what = "truncated" if have < want else "longer than its header says"
        raise DataError(
            f"IDX file {one_line(str(source))} is {what}: header shape {dims} needs {want} bytes, "
            f"file holds {have}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


@lru_cache(maxsize=8)
def _load_pair_cached(
    images_path: str, labels_path: str, _stamp: tuple[int, int, int, int]
) -> tuple[np.ndarray, np.ndarray]:
    images = parse_idx(_read_bytes(Path(images_path)), IMAGES_MAGIC, images_path)
    labels = parse_idx(_read_bytes(Path(labels_path)), LABELS_MAGIC, labels_path)
    if labels.shape[0] != images.shape[0]:
        raise DataError(
            f"{one_line(str(labels_path))} has {labels.shape[0]} labels but {one_line(str(images_path))} has "
            f"{images.shape[0]} images"
        )
    if labels.size and int(labels.max()) >= NUM_CLASSES:
        raise DataError(
            f"IDX file {one_line(str(labels_path))} holds label {int(labels.max())}; Fashion-MNIST has "
            f"{NUM_CLASSES} classes (0-{NUM_CLASSES - 1})"
        )
    # Read-only views into one immutable buffer: cached arrays cannot be altered by callers.
    return images, labels


def load_idx_pair(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Decoded (images [N, H, W] uint8, labels [N] uint8), cached per path in memory.

    The cache key includes size and mtime, so a file rewritten in place is read again.
    """
    try:
        si, sl = os.stat(images_path), os.stat(labels_path)
    except OSError as exc:
        raise DataError(f"cannot read IDX file: {one_line(str(exc))}") from None
    stamp = (si.st_size, si.st_mtime_ns, sl.st_size, sl.st_mtime_ns)
    return _load_pair_cached(str(images_path), str(labels_path), stamp)
