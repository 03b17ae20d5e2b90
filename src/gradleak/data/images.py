"""Decode one image (any PIL mode, any size) into a [C, S, S] float tensor in [0, 1]: every source
ends up here, so all get the same mode handling, resize and crop."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from gradleak.errors import ConfigError, DataError
from gradleak.paths import one_line

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
)

# Bicubic in PIL filters over the whole footprint when shrinking, i.e. it antialiases.
_RESAMPLE = Image.Resampling.BICUBIC
_WHITE = (255, 255, 255, 255)


def check_geometry(image_size: int, channels: int) -> None:
    """Reject an impossible output geometry early, with the field named."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ConfigError(f"image_size must be a positive integer, got {image_size!r}")
    if channels not in (1, 3):
        raise ConfigError(f"channels must be 1 or 3, got {channels!r}")


def is_image_file(path: str | os.PathLike[str]) -> bool:
    """True for a name with one of :data:`IMAGE_EXTENSIONS` (case-insensitive)."""
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def _deepen_to_8bit(img: Image.Image) -> Image.Image:
    """Map 16/32-bit integer and float grayscale to mode "L" by scaling, not clipping.

    PIL's own ``convert("L")`` clips I;16 / I values at 255, which turns a 16-bit photo
    almost white; scale by the bit depth instead.
    """
    arr = np.asarray(img)
    if img.mode.startswith("I;16"):
        scaled = arr.astype(np.float64) / 65535.0
    elif img.mode == "I":
        # 32-bit ints mostly hold 16-bit data (TIFF, old PNG decoders); 8-bit data stays 8-bit.
        peak = float(arr.max()) if arr.size else 0.0
        scaled = arr.astype(np.float64) / (255.0 if peak <= 255 else 65535.0)
    else:  # "F": floats in [0, 1], [0, 255] or [0, 65535]
        finite = np.nan_to_num(arr.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        peak = float(finite.max()) if finite.size else 0.0
        scaled = finite / (1.0 if peak <= 1.0 else 255.0 if peak <= 255.0 else 65535.0)
    return Image.fromarray(np.round(np.clip(scaled, 0.0, 1.0) * 255.0).astype(np.uint8), "L")


def _to_base_mode(img: Image.Image) -> Image.Image:
    """Any PIL mode -> "L" or "RGB", compositing transparency onto white."""
    has_alpha = img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info
    if img.mode in ("L", "RGB") and not has_alpha:
        return img
    if img.mode == "1":
        return img.convert("L")
    if img.mode.startswith("I") or img.mode == "F":
        return _deepen_to_8bit(img)
    if has_alpha:
        # Transparent pixels carry arbitrary colour underneath; white is what a viewer shows.
        grey = img.mode in ("L", "LA", "La")
        rgba = img.convert("RGBA")
        flat = Image.alpha_composite(Image.new("RGBA", rgba.size, _WHITE), rgba).convert("RGB")
        return flat.convert("L") if grey else flat
    if img.mode == "P":
        palette_mode = img.palette.mode if img.palette is not None else "RGB"
        return img.convert("L" if palette_mode == "L" else "RGB")
    return img.convert("RGB")  # CMYK, YCbCr, LAB, HSV, RGBX...


def pil_to_tensor(img: Image.Image, image_size: int, channels: int) -> torch.Tensor:
    """A decoded PIL image -> [channels, image_size, image_size] float32 in [0, 1].

    Non-square images: the centred square of side min(W, H) is resized to image_size,
    which is exactly "resize the shorter side, then centre-crop" done in one resampling.
    """
    check_geometry(image_size, channels)
    img = _to_base_mode(img)
    img = img.convert("L") if channels == 1 else img.convert("RGB")  # no-op when equal
    w, h = img.size
    if (w, h) != (image_size, image_size):
        side = min(w, h)
        left, top = (w - side) / 2.0, (h - side) / 2.0
        box = None if w == h else (left, top, left + side, top + side)
        img = img.resize((image_size, image_size), _RESAMPLE, box=box)
    arr = np.array(img, dtype=np.uint8)  # copy: writable, owns its memory
    tensor = torch.from_numpy(arr).to(torch.float32).div_(255.0)
    if tensor.ndim == 2:
        return tensor.unsqueeze(0).contiguous()
    return tensor.permute(2, 0, 1).contiguous()


def load_image_file(
    path: str | os.PathLike[str], image_size: int, channels: int
) -> torch.Tensor:
    """Read one image file -> [channels, image_size, image_size] float32 in [0, 1].

    Raises DataError naming the file when it is missing, not an image, truncated, or larger
    than PIL's decompression-bomb limit.
    """
    check_geometry(image_size, channels)
    path = Path(path)
    try:
        with Image.open(path) as img:
            img.load()  # decode now: truncated files only fail here
            return pil_to_tensor(img, image_size, channels)
    except FileNotFoundError:
        raise DataError(f"image file not found: {one_line(str(path))}") from None
    except IsADirectoryError:
        raise DataError(f"expected an image file but {one_line(str(path))} is a folder") from None
    except Image.DecompressionBombError as exc:
        raise DataError(f"image {one_line(str(path))} is too large to decode safely: {one_line(str(exc))}") from None
    except UnidentifiedImageError:
        raise DataError(f"cannot read image {one_line(str(path))}: not a recognised image format") from None
    except (OSError, ValueError, SyntaxError) as exc:
        # SyntaxError: some PIL plugins raise it for malformed headers.
        raise DataError(f"cannot read image {one_line(str(path))}: {one_line(str(exc))}") from None
