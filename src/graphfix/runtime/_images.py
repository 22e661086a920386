"""Images as calibration data: the --preprocess spec and a folder of jpg/png files.

Each image (sorted by file name) is one sample: read with Pillow, converted to RGB
(`bgr` flips the channels; to grayscale, Pillow's L, where the model's input has one
channel), resized to (height, width) with bilinear filtering,
multiplied by `scale`, then normalized per channel as (x - mean) / std, and laid
out as CHW (NCHW models) or HWC (NHWC models); a model input of rank 3 takes the image
itself (torchvision's detectors: [3, H, W], no batch axis). `mean` and `std` are in the model's
channel order, i.e. after the `bgr` flip. Without `resize`, images are resized to
the model's static height and width; when those are dynamic, images keep their size.
Pillow is imported only here, and only when an image folder is used.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graphfix.errors import GraphfixError
from graphfix.runtime._blocks import Block, FeedChecker, show_dims

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_EXAMPLE = "resize=224,layout=NCHW,scale=1/255,mean=0.485/0.456/0.406,std=0.229/0.224/0.225"
_KEYS = ("resize", "layout", "scale", "mean", "std", "bgr")
_RESIZE = re.compile(r"^(\d+)(?:x(\d+))?$")


def _bad(what: str, why: str) -> GraphfixError:
    return GraphfixError(what, why, f"write it like --preprocess {_EXAMPLE} (add ,bgr for "
                         "BGR models); keys may be left out")


@dataclass(frozen=True)
class Preprocess:
    """How images become model inputs (see the module docstring)."""

    resize: tuple[int, int] | None = None  # (height, width)
    layout: str = "NCHW"
    scale: float = 1 / 255
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    bgr: bool = False

    def __post_init__(self) -> None:
        if self.resize is not None and (len(self.resize) != 2 or min(self.resize) < 1):
            raise _bad(f"resize={self.resize} is not a size", "it must be two positive ints")
        if self.layout not in ("NCHW", "NHWC"):
            raise _bad(f"layout={self.layout} is not a layout", "it must be NCHW or NHWC")
        if not math.isfinite(self.scale) or self.scale == 0:
            raise _bad(f"scale={self.scale} is not usable", "it must be a nonzero number")
        for key in ("mean", "std"):
            values = getattr(self, key)
            if len(values) not in (0, 1, 3) or not all(map(math.isfinite, values)):
                raise _bad(f"{key} has {len(values)} values",
                           "give 1 value or 3 (one per channel), joined by '/'")
        if 0 in self.std:
            raise _bad("std has a zero", "images are divided by std")

    @classmethod
    def parse(cls, text: str) -> Preprocess:
        """`resize=224,layout=NCHW,scale=1/255,mean=a/b/c,std=a/b/c,bgr` -> Preprocess.

        `resize` is one size (square) or HxW; `scale` may be a fraction; keys left out
        keep their defaults; `str()` gives the text back."""
        fields: dict[str, Any] = {}
        for item in (t.strip() for t in text.split(",")):
            if not item:
                continue
            key, sep, value = (s.strip() for s in item.partition("="))
            key = key.lower()
            if key not in _KEYS:
                raise _bad(f"Unknown --preprocess key '{key}'", f"keys are {', '.join(_KEYS)}")
            if key in fields:
                raise _bad(f"--preprocess gives '{key}' twice", "each key may appear once")
            if key == "bgr":
                if sep:
                    raise _bad(f"--preprocess gives bgr a value ('{item}')",
                               "it is a flag: write just bgr")
                fields[key] = True
            elif not value:
                raise _bad(f"--preprocess key '{key}' has no value", f"write {key}=VALUE")
            else:
                fields[key] = _value(key, value)
        return cls(**fields)

    def __str__(self) -> str:
        parts = []
        if self.resize is not None:
            h, w = self.resize
            parts.append(f"resize={h}" if h == w else f"resize={h}x{w}")
        parts += [f"layout={self.layout}", f"scale={_number_text(self.scale)}"]
        for key in ("mean", "std"):
            if getattr(self, key):
                parts.append(f"{key}=" + "/".join(repr(v) for v in getattr(self, key)))
        return ",".join(parts + (["bgr"] if self.bgr else []))


def _value(key: str, text: str) -> Any:
    if key == "resize":
        match = _RESIZE.match(text)
        if not match:
            raise _bad(f"resize={text} is not a size", "write resize=224 or resize=HxW")
        h = int(match.group(1))
        return (h, int(match.group(2) or h))
    if key == "layout":
        return text.upper()
    if key == "scale":
        return _number(key, text, fraction=True)
    return tuple(_number(key, t, fraction=False) for t in text.split("/"))


def _number(key: str, text: str, fraction: bool) -> float:
    try:
        if fraction and "/" in text:
            num, den = text.split("/")
            return float(num) / float(den)
        return float(text)
    except (ValueError, ZeroDivisionError):
        how = "a number or a fraction like 1/255" if fraction else "numbers joined by '/'"
        raise _bad(f"{key}={text} is not understood", f"{key} takes {how}") from None


def _number_text(value: float) -> str:
    inverse = round(1 / value)
    return f"1/{inverse}" if inverse > 1 and 1 / inverse == value else repr(value)


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise GraphfixError("Reading images needs Pillow, which is not installed",
                            "Pillow reads the jpg/png calibration images",
                            "install it: pip install pillow") from None
    return Image


class ImageFolder:
    """One block per image; each image is read and preprocessed when its block is used."""

    blocks: list[Block]

    def __init__(self, folder: Path, paths: list[Path], spec: Preprocess,
                 checker: FeedChecker, classes: list[str] | None = None,
                 labels: np.ndarray | None = None) -> None:
        if len(checker.inputs) != 1:
            names = ", ".join(i.name for i in checker.inputs)
            raise GraphfixError(
                f"An image folder can feed only a single-input model; this one has {names}",
                "each image becomes the one input",
                "write a data-loader script (--data-loader-script file.py:load_data)",
            )
        info = checker.inputs[0]
        self._name, self._spec, self._paths = info.name, spec, paths
        self._dtype = _float_dtype(info)
        self._size = spec.resize or _model_size(info, spec)
        self._channels = _channels(info, spec)
        image = _pillow()
        self.blocks = []
        for path in paths:
            try:
                with image.open(path) as im:
                    w, h = im.size
            except Exception as err:  # Pillow raises many types for broken files
                raise GraphfixError(f"Cannot read the image '{path}'", f"Pillow says: {err}",
                                    "remove or replace the file") from None
            shape = _layout(spec, self._size or (h, w), self._channels)
            _check_image(info, spec, shape, path)
            self.blocks.append(checker.check(str(path), {info.name: (shape, self._dtype)}))
        self.labels = labels  # per image, the index of its class folder (class layout)
        where = f" in {len(classes)} class folders" if classes else ""
        self.label = f"{folder.name or folder}/ ({len(paths)} images{where}, {spec})"

    def hint(self) -> str:
        """What to try when the model cannot run these images: images kept at their own
        sizes (the model's are dynamic) may not fit a network that needs sizes its
        strides divide."""
        if self._size is not None:
            return ""
        return (f"; the images keep their own sizes ({self._sizes_text()}), as the model's "
                "height and width are dynamic: pass resize=HxW in --preprocess with the size "
                "the model was made for")

    def _sizes_text(self) -> str:
        spatial = (lambda s: s[-2:]) if self._spec.layout == "NCHW" else (lambda s: s[-3:-1])
        sizes = list(dict.fromkeys(tuple(spatial(block.shapes[0])) for block in self.blocks))
        shown = ", ".join("x".join(map(str, s)) for s in sizes[:3])
        return shown + (f" and {len(sizes) - 3} more" if len(sizes) > 3 else "")

    def read(self, first: int = 0) -> Iterator[tuple[str, Mapping[str, Any]]]:
        for path in self._paths[first:]:
            yield str(path), {self._name: self._load(path)}

    def _load(self, path: Path) -> np.ndarray:
        image = _pillow()
        bilinear = getattr(image, "Resampling", image).BILINEAR
        spec = self._spec
        with image.open(path) as im:
            rgb = im.convert("RGB" if self._channels == 3 else "L")
            if self._size is not None and rgb.size != self._size[::-1]:
                rgb = rgb.resize(self._size[::-1], bilinear)  # Pillow takes (width, height)
            x = np.asarray(rgb, dtype=np.float32)
        if self._channels == 1:
            x = x[..., np.newaxis]
        if spec.bgr and self._channels == 3:
            x = x[..., ::-1]
        x = x * np.float32(spec.scale)
        if spec.mean:
            x = x - np.asarray(spec.mean, dtype=np.float32)
        if spec.std:
            x = x / np.asarray(spec.std, dtype=np.float32)
        if spec.layout == "NCHW":
            x = x.transpose(2, 0, 1)
        return np.ascontiguousarray(x, dtype=self._dtype)


def _float_dtype(info) -> np.dtype:
    if info.dtype is None:
        return np.dtype(np.float32)
    if info.dtype.kind != "f":
        raise GraphfixError(
            f"Input '{info.name}' is {info.dtype}, but image preprocessing gives floats",
            "an image folder feeds float inputs only",
            "write a data-loader script (--data-loader-script file.py:load_data)",
        )
    return info.dtype


def _channel_axes(spec: Preprocess, rank: int = 4) -> tuple[int, int, int]:
    """(channel, height, width) axes of the model input for the layout: a batch of images
    (rank 4), or one image with no batch axis (rank 3: torchvision's detectors take
    [3, H, W])."""
    c, h, w = (1, 2, 3) if spec.layout == "NCHW" else (3, 1, 2)
    return c - (4 - rank), h - (4 - rank), w - (4 - rank)


def _model_size(info, spec: Preprocess) -> tuple[int, int] | None:
    """The model's static (height, width), or None when both are dynamic."""
    if info.dims is None or len(info.dims) not in (3, 4):
        return None
    _, h, w = (info.dims[a] for a in _channel_axes(spec, len(info.dims)))
    if isinstance(h, int) and isinstance(w, int):
        return h, w
    if isinstance(h, int) or isinstance(w, int):
        raise GraphfixError(
            f"Input '{info.name}' {show_dims(info.dims)} has one static and one dynamic "
            "spatial dim, so graphfix cannot choose the image size",
            "without resize=, images are resized to the model's height and width",
            "pass resize=HxW in --preprocess",
        )
    return None


def _layout(spec: Preprocess, size: tuple[int, int], channels: int = 3
            ) -> tuple[int, int, int]:
    return (channels, *size) if spec.layout == "NCHW" else (*size, channels)


def _channels(info, spec: Preprocess) -> int:
    """1 where the model's input has one static channel (images are read as grayscale),
    else 3 (RGB); per-channel mean/std must then have one value."""
    dims = info.dims
    if dims is None or len(dims) not in (3, 4):
        return 3
    c = dims[_channel_axes(spec, len(dims))[0]]
    if c != 1:
        return 3
    for key in ("mean", "std"):
        if len(getattr(spec, key)) == 3:
            raise GraphfixError(
                f"--preprocess gives {key} 3 values, but input '{info.name}' "
                f"{show_dims(dims)} has 1 channel",
                "images for a one-channel input are read as grayscale",
                f"give {key} one value")
    return 1


def _check_image(info, spec: Preprocess, shape: tuple[int, int, int], path: Path) -> None:
    """Image-specific errors before the generic shape check."""
    dims = info.dims
    if dims is None:
        return
    if len(dims) not in (3, 4):
        raise GraphfixError(
            f"Input '{info.name}' {show_dims(dims)} is not an image or a batch of images",
            "an image folder feeds 4-D inputs (NCHW or NHWC) or single images without a "
            "batch axis (CHW or HWC)",
            "write a data-loader script (--data-loader-script file.py:load_data)",
        )
    c, h, w = (dims[a] for a in _channel_axes(spec, len(dims)))
    if isinstance(c, int) and c not in (1, 3):
        raise GraphfixError(
            f"Input '{info.name}' {show_dims(dims)} has {c} channels in layout {spec.layout}",
            "images are read as RGB (3 channels), or as grayscale for a 1-channel input",
            "pass the other layout= in --preprocess if the model is "
            + ("NHWC" if spec.layout == "NCHW" else "NCHW")
            + ", or write a data-loader script for other channel counts",
        )
    got = shape[1:] if spec.layout == "NCHW" else shape[:2]
    for want, have, axis in ((h, got[0], "height"), (w, got[1], "width")):
        if isinstance(want, int) and want != have:
            raise GraphfixError(
                f"'{path}' becomes {got[0]}x{got[1]}, but input '{info.name}' "
                f"{show_dims(dims)} has {axis} {want}",
                f"resize={spec.resize[0]}x{spec.resize[1]} sets the image size"
                if spec.resize else "the image is used at its own size",
                "leave resize= out (images are then resized to the model's size) "
                "or set it to the model's HxW",
            )
