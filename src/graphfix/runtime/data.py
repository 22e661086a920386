"""Calibration data: `open_data(...) -> CalibrationData`, a re-iterable source of feed dicts.

What `--data` may be:

- a folder of .npy files (single-input models) or .npz files (input name -> array),
  one sample or a stack of samples (leading axis) per file, in sorted file order;
- a single .npz whose arrays stack samples along axis 0: `--data-key` picks the array
  for a single-input model, else the arrays named like the inputs (or the only array)
  are used. Its members are streamed, stored (numpy.savez) or compressed
  (numpy.savez_compressed) alike: a few MB of rows at a time, all arrays side by side,
  so memory does not grow with the sample count (an array saved in Fortran order is
  the exception: it is read whole once per pass, see `_sources`);
- a single .npy stacking samples along axis 0, streamed the same way;
- a folder of jpg/png images with a `Preprocess` spec (`--preprocess`), see `_images`;
- or, instead of `--data`, a data-loader script `file.py:function` (`load_data` by
  default) whose function returns an iterable of feed dicts. It runs the user's code,
  hence the explicit flag.

Checking: every sample must fit the model's inputs (the graph inputs that are not
initializers): same names, same dtypes (float64 data for a float32 input is cast and
describe() says so), static dims equal, dynamic dims free; see `_feeds` for the rules.
Files and images are checked from their headers before any array is read (and a file
shorter than its header says is refused), so a bad file anywhere fails `open_data`
itself. A loader script's items are checked as they come, since they cannot be known
earlier.

Iteration: every pass yields the same batches in the same order: `batch_size` samples
cut and concatenated along axis 0 (the last batch may be smaller), one file, image,
loader item or block of a single file's rows in memory at a time (plus the rows of the
batch being formed). For a loader script, every pass calls the function again; the
script must give the same data each time, and a pass that gives fewer samples than the
first is an error. Its sample count is known after the first full pass (`num_samples`
runs one when needed).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from graphfix.errors import GraphfixError
from graphfix.runtime._blocks import Block, FeedChecker, Source, batches, check_batches
from graphfix.runtime._images import IMAGE_SUFFIXES, ImageFolder, Preprocess
from graphfix.runtime._sources import LoaderScript, array_folder, single_npy, single_npz
from graphfix.runtime.feeds import InputInfo, graph_inputs

__all__ = ["CalibrationData", "InputSpec", "Preprocess", "first_feeds", "open_data",
           "open_runs", "run_batch"]
OWN_BATCH_MAX = 32  # samples of a file's stack the per-pass check runs at once


@dataclass(frozen=True)
class InputSpec(InputInfo):
    """A model input: name, numpy dtype, and `shape` (= `dims`): ints for static dims,
    a name or None for dynamic ones (None as a whole when no shape is declared)."""

    @property
    def shape(self) -> tuple[int | str | None, ...] | None:
        return self.dims


class CalibrationData:
    """Re-iterable: each iteration yields feed dicts {input name: np.ndarray} of at most
    batch_size samples (last may be smaller), validated, in a fixed order.

    Made by `open_data`; `split` divides it. Rows [start, stop) of the source's samples
    are used; `stop` is None or an upper bound until a loader script has been counted.
    """

    def __init__(self, source: Source, inputs: list[InputSpec], checker: FeedChecker,
                 start: int, stop: int | None, total: int | None, counted: bool = True
                 ) -> None:
        self.inputs = inputs
        self._source = source
        self._checker = checker
        self._start, self._stop, self._total = start, stop, total
        self._counted = counted
        if counted:
            self._check_range()

    @property
    def batch_size(self) -> int:
        return self._checker.batch_size

    @property
    def num_samples(self) -> int:
        """Samples after max_samples. For a loader script this is counted on the first
        full pass; reading it before one runs that pass (the script runs once more)."""
        if not self._counted:
            for _ in self:
                pass
        return self._stop - self._start

    @property
    def span(self) -> tuple[int, int | None]:
        """[start, stop) of these samples among the source's (after max_samples and
        split): where a labels array that covers the whole source is read."""
        return self._start, self._stop

    def folder_labels(self) -> np.ndarray | None:
        """Each sample's class index when the data is an image folder of class subfolders
        (None otherwise), for these samples (`span`)."""
        labels = getattr(self._source, "labels", None)
        if labels is None:
            return None
        start, stop = self.span
        return labels[start:stop]

    def hint(self) -> str:
        """What to add to "give data the model accepts" when onnxruntime cannot run a
        batch of this data ("" when nothing is known to help)."""
        hint = getattr(self._source, "hint", None)
        return hint() if callable(hint) else ""

    def rows(self, feeds: dict[str, np.ndarray]) -> int:
        """Samples in one of the feed dicts this yields."""
        return self._checker.rows(feeds)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        first, offset = self._first_block()
        blocks = (self._checker.normalize(where, raw)
                  for where, raw in self._source.read(first))
        stop = None if self._stop is None else self._stop - offset
        seen = yield from batches(blocks, self._start - offset, stop, self._checker)
        if self._source.blocks is None:
            self._count(seen)

    def describe(self) -> str:
        """One line: '200 samples from digits_dev_data.npz['calib'], batches of 32'."""
        label = self._source.label
        if not self._counted:
            text = f"samples from {label} (counted on the first pass)"
        else:
            n = self._stop - self._start
            text = f"{n} samples from {label}"
            if self._total is not None and n != self._total:
                text = (f"{n} of {self._total} samples ({self._start + 1}-{self._stop}) "
                        f"from {label}")
        text += f", batches of {self.batch_size}"
        if self._checker.casts:
            names = ", ".join(f"'{n}'" for n in sorted(self._checker.casts))
            text += f"; float64 data cast to float32 for {names}"
        return text

    def split(self, eval_count: int) -> tuple[CalibrationData, CalibrationData]:
        """(the first num_samples - eval_count samples, the last eval_count samples);
        both re-iterable, both in this object's order."""
        n = self.num_samples
        if not 0 < eval_count < n:
            raise GraphfixError(
                f"Cannot hold {eval_count} of {n} samples apart",
                "both the calibration part and the held-apart part need samples",
                f"hold apart between 1 and {n - 1} samples",
            )
        cut = self._stop - eval_count
        make = type(self)
        return (make(self._source, self.inputs, self._checker, self._start, cut, self._total),
                make(self._source, self.inputs, self._checker, cut, self._stop, self._total))

    def _first_block(self) -> tuple[int, int]:
        """(index of the first block holding row `start`, rows before it)."""
        pos = 0
        for index, block in enumerate(self._source.blocks or ()):
            if pos + block.rows > self._start:
                return index, pos
            pos += block.rows
        return 0, 0

    def _check_range(self) -> None:
        n = self._stop - self._start
        if n == 0:
            raise GraphfixError(f"{self._source.label} holds no samples",
                                "calibration needs at least one sample", "check --data")
        fixed = self._checker.static_batch
        if fixed and n % fixed:
            raise GraphfixError(
                f"{n} samples do not fill batches of {fixed}",
                f"the model's batch axis is static ({fixed}), so every run takes exactly "
                f"{fixed} samples",
                f"use a multiple of {fixed} samples"
                + (f" (--max-samples {n - n % fixed})" if n > fixed else ""),
            )
        if self._source.blocks is not None:
            check_batches(self._source.blocks, self._start, self._stop, self.batch_size)

    def _count(self, seen: int) -> None:
        """After a full pass: fix the sample count of a loader script, or check it."""
        if self._counted:
            if self._stop is not None and seen < self._stop:
                raise GraphfixError(
                    f"The data-loader script {self._source.label} gave {seen} samples on "
                    f"this pass, fewer than the {self._stop} it gave before",
                    "calibration reads the data several times and needs the same samples "
                    "each time",
                    "make the function give the same data on every call",
                )
            return
        self._stop = seen if self._stop is None else min(seen, self._stop)
        self._counted = True
        if self._stop == 0:
            raise GraphfixError(f"The data-loader script {self._source.label} gave no "
                                "samples", "calibration needs at least one sample",
                                "make the function yield feed dicts")


def open_data(
    source: str | os.PathLike | None,
    model: onnx.ModelProto,
    *,
    data_key: str | None = None,
    preprocess: Preprocess | None = None,
    loader_script: str | None = None,
    max_samples: int | None = None,
    batch_size: int = 1,
    batch_option: str | None = "--batch-size",
) -> CalibrationData:
    """Calibration data for `model` from `source` (see the module docstring for the forms).

    Checks the options and every file's header against the model's inputs before
    returning; raises GraphfixError (what, why, fix) naming the file and input.
    `batch_option` is the calling command's flag for `batch_size`, named in errors
    (None: the command has none, and errors say what data would fit)."""
    for flag, value in (("--batch-size", batch_size), ("--max-samples", max_samples)):
        if value is not None and value < 1:
            raise GraphfixError(f"{flag} {value} is not usable", "it counts samples",
                                f"pass {flag} 1 or more")
    inputs = [InputSpec(i.name, i.dtype, i.dims) for i in graph_inputs(model)]
    if not inputs:
        raise GraphfixError("The model has no inputs to calibrate with",
                            "every graph input is an initializer", "")
    checker = FeedChecker(inputs, batch_size, batch_option)
    src = _open_source(source, checker, data_key, preprocess, loader_script)
    if src.blocks is None:
        return CalibrationData(src, inputs, checker, 0, max_samples, None, counted=False)
    total = sum(b.rows for b in src.blocks)
    stop = total if max_samples is None else min(total, max_samples)
    return CalibrationData(src, inputs, checker, 0, stop, total)


def run_batch(model: onnx.ModelProto) -> int:
    """The samples one check run takes: the static axis 0 all inputs share when none is
    dynamic (a model exported for batch 4), else 1."""
    firsts = {i.dims[0] if i.dims else 1 for i in graph_inputs(model) if i.dims is not None}
    return firsts.pop() if len(firsts) == 1 and isinstance(next(iter(firsts)), int) else 1


def open_runs(source: str | os.PathLike, model: onnx.ModelProto, *,
              data_key: str | None = None, runs: int = 1,
              preprocess: str | Preprocess | None = None) -> CalibrationData:
    """The first `runs` runs' worth of anything `open_data` reads, for a command with no
    --batch-size: `run_batch` samples a run, or one where the model's static axis 0
    is not a batch axis and the data says so (torchvision's detectors take an image
    [3, H, W]: [N, 3, H, W] data is N images, not rows of a batch of 3). `preprocess`
    (its --preprocess text or parsed) reads an image folder."""
    batch = run_batch(model)
    if isinstance(preprocess, str):
        preprocess = Preprocess.parse(preprocess)
    try:
        return open_data(source, model, data_key=data_key, max_samples=runs * batch,
                         batch_size=batch, batch_option=None, preprocess=preprocess)
    except GraphfixError as err:
        if batch == 1:
            raise
        try:
            return open_data(source, model, data_key=data_key, max_samples=runs,
                             batch_size=1, batch_option=None, preprocess=preprocess)
        except GraphfixError:
            raise err from None


def first_feeds(source: str | os.PathLike, model: onnx.ModelProto,
                data_key: str | None = None,
                preprocess: str | Preprocess | None = None) -> dict[str, np.ndarray]:
    """The first run's inputs of anything `open_data` reads, for a command with no
    --batch-size (the per-pass check of `graphfix run`): `run_batch` samples; when every
    input's axis 0 is dynamic, the first file's own stack (an .npz of [2, 3, 32, 32] runs
    as batch 2), at most `OWN_BATCH_MAX` samples of it. `preprocess`: as `open_runs`."""
    if isinstance(preprocess, str):
        preprocess = Preprocess.parse(preprocess)
    data = open_runs(source, model, data_key=data_key, preprocess=preprocess)
    blocks = data._source.blocks
    free = all(i.dims is None or (i.dims and not isinstance(i.dims[0], int))
               for i in data.inputs)
    own = min(_first_file_rows(blocks), OWN_BATCH_MAX) if blocks and free else 1
    if own > 1:
        data = open_data(source, model, data_key=data_key, max_samples=own, batch_size=own,
                         batch_option=None, preprocess=preprocess)
    return next(iter(data))


def _first_file_rows(blocks: list[Block]) -> int:
    """The rows of the first file: a single file read in blocks of rows gives blocks
    that share its `where`."""
    rows = 0
    for block in blocks:
        if block.where != blocks[0].where:
            break
        rows += block.rows
    return rows


def _open_source(source: str | os.PathLike | None, checker: FeedChecker,
                 data_key: str | None, preprocess: Preprocess | None,
                 loader_script: str | None) -> Source:
    if loader_script is not None:
        if source is not None:
            raise GraphfixError("Both --data and --data-loader-script were given",
                                "only one source is read", "pass only one")
        _refuse(data_key is not None, "--data-key", "a single .npz", "a data-loader script")
        _refuse(preprocess is not None, "--preprocess", "an image folder",
                "a data-loader script")
        return LoaderScript(loader_script)
    if source is None:
        raise GraphfixError("No calibration data was given", "calibration needs samples",
                            "pass --data PATH or --data-loader-script file.py:load_data")
    path = Path(source)
    if path.is_dir():
        return _folder(path, checker, data_key, preprocess)
    if not path.is_file():
        raise GraphfixError(f"The data path '{path}' does not exist",
                            "there is no file or folder at that path (relative paths start "
                            f"at '{os.getcwd()}')", "check the path given to --data")
    suffix = path.suffix.lower()
    _refuse(preprocess is not None, "--preprocess", "an image folder", f"'{path}'")
    if suffix == ".npz":
        return single_npz(path, checker, data_key)
    _refuse(data_key is not None, "--data-key", "a single .npz", f"'{path}'")
    if suffix == ".npy":
        return single_npy(path, checker)
    raise GraphfixError(
        f"Cannot read '{path}' as calibration data",
        "--data takes a folder of .npy, .npz or jpg/png files, or one .npz or .npy file",
        "convert the data to one of those, or pass --data-loader-script file.py:load_data",
    )


def _folder(path: Path, checker: FeedChecker, data_key: str | None,
            preprocess: Preprocess | None) -> Source:
    entries = sorted((p for p in path.iterdir() if not p.name.startswith(".")),
                     key=lambda p: p.name)
    classes = _class_folders(entries)
    if classes:
        _refuse(data_key is not None, "--data-key", "a single .npz", f"the folder '{path}'")
        _need_preprocess(path, preprocess)
        paths, labels = _round_robin(classes)
        return ImageFolder(path, paths, preprocess, checker, list(classes), labels)
    kinds: dict[str, list[Path]] = {}
    for item in entries:
        suffix = item.suffix.lower()
        kind = "image" if suffix in IMAGE_SUFFIXES else suffix
        if item.is_file() and kind in ("image", ".npy", ".npz"):
            kinds.setdefault(kind, []).append(item)
    if not kinds:
        raise GraphfixError(f"The folder '{path}' has no .npy, .npz, jpg or png files",
                            "files are read from the folder itself, or images from class "
                            "subfolders (folder/CLASS/*.jpg), not from anywhere deeper",
                            "point --data at the folder that holds the files")
    if len(kinds) > 1:
        found = " and ".join(f"{len(v)} {k} files" for k, v in kinds.items())
        raise GraphfixError(f"The folder '{path}' mixes {found}",
                            "one folder holds one kind of data",
                            "put each kind in its own folder")
    _refuse(data_key is not None, "--data-key", "a single .npz", f"the folder '{path}'")
    (kind, paths), = kinds.items()
    if kind != "image":
        _refuse(preprocess is not None, "--preprocess", "an image folder", f"'{path}'")
        return array_folder(path, paths, checker)
    _need_preprocess(path, preprocess)
    return ImageFolder(path, paths, preprocess, checker)


def _need_preprocess(path: Path, preprocess: Preprocess | None) -> None:
    if preprocess is None:
        raise GraphfixError(
            f"The folder '{path}' holds images, but no --preprocess was given",
            "how pixels become model inputs (size, layout, scale, mean, std) decides what "
            "the model sees, and the ranges calibration measures",
            "pass e.g. --preprocess resize=224,layout=NCHW,scale=1/255,mean=0.485/0.456/"
            "0.406,std=0.229/0.224/0.225 (--preprocess scale=1/255 for plain [0, 1] pixels)",
        )


def _class_folders(entries: list[Path]) -> dict[str, list[Path]]:
    """An image dataset in class-folder layout (torchvision's ImageFolder, ImageNet's
    val/ sorted into synsets): no data file among a folder's `entries` (its listing, by
    name, hidden ones left out), subfolders holding images. {class name: its images,
    sorted}, classes sorted by name; {} for any other folder."""
    if not entries or any(p.is_file() and p.suffix.lower() in (".npy", ".npz", *IMAGE_SUFFIXES)
                          for p in entries):
        return {}
    classes = {}
    for sub in (p for p in entries if p.is_dir()):
        images = sorted((p for p in sub.iterdir() if p.is_file() and not p.name.startswith(".")
                         and p.suffix.lower() in IMAGE_SUFFIXES), key=lambda p: p.name)
        if images:
            classes[sub.name] = images
    return classes


def _round_robin(classes: dict[str, list[Path]]) -> tuple[list[Path], np.ndarray]:
    """The images one class at a time in turn (class 0's first, class 1's first, ...,
    class 0's second, ...), so that the first N samples (--samples) and the last N
    (--eval-split) come from every class; and each one's label, its class's index in
    name order (torchvision's ImageFolder numbering)."""
    order: list[tuple[Path, int]] = []
    lists = list(classes.values())
    for depth in range(max(len(v) for v in lists)):
        order += [(images[depth], k) for k, images in enumerate(lists) if depth < len(images)]
    return [p for p, _ in order], np.array([k for _, k in order], np.int64)


def _refuse(given: bool, flag: str, applies_to: str, source: str) -> None:
    if given:
        raise GraphfixError(f"{flag} does not apply to {source}",
                            f"{flag} is used only with {applies_to}", f"leave {flag} out")
