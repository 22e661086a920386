"""Checking calibration samples against a model's inputs, and forming batches from them.

Every block of data (a file, an image, one item of a data-loader script) is a mapping
{input name: array}. For a model input of rank r, an array of rank r is a stack of
samples along axis 0 (one row per sample); an array of rank r - 1 is one sample and
gets a leading axis. Only axis 0 is the sample axis: every other static dim must
match, dynamic dims (symbolic or unnamed) may be any size, and one symbolic name
must have one size across the inputs of a block. dtypes must match exactly, except
float64 data for a float32 input, which is cast.

Batches are formed by cutting and concatenating rows along axis 0, so they do not
depend on how samples are spread over files. A model input whose axis 0 is static
(N) takes exactly N rows per run, so the batch size must be N; a scalar input takes
one sample per run. Except, with batch size 1 (the default): an input whose static
axis 0 is N > 1 is not batched (recurrent state [2, batch, 128]; torchvision's
detectors' image [3, height, width], which has no batch axis): one sample of it is the
whole array, N samples stack along a new leading axis. Data that fits such an input
only as rows (a model exported with a static batch of 4 and data [100, 3, 224, 224])
is told to pass --batch-size N.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from graphfix.errors import GraphfixError
from graphfix.runtime.feeds import InputInfo

Header = tuple[tuple[int, ...], np.dtype]  # (shape, dtype) of one array, read or known


@dataclass(frozen=True)
class Block:
    """What one block of data holds: where it is, its rows, each input's sample shape.
    A single file read in parts gives several blocks with the file's `where`."""

    where: str
    rows: int
    shapes: tuple[tuple[int, ...], ...]  # per model input, in model order, without axis 0


class Source(Protocol):
    """Where blocks come from: files (known before reading) or a loader script."""

    label: str  # for describe(): "digits_dev_data.npz['calib']"
    blocks: list[Block] | None  # per block, known before any reading; None for a script

    def read(self, first: int = 0) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """(where, {name: array}) per block, from block `first` on, one at a time."""
        ...


def show_dims(dims: tuple[int | str | None, ...] | None) -> str:
    if dims is None:
        return "[any shape]"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def show_shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def pickled(where: str) -> GraphfixError:
    return GraphfixError(
        f"'{where}' holds Python objects (a pickle), which graphfix does not load",
        "loading a pickle can run arbitrary code, so arrays are read with allow_pickle=False",
        "save plain numeric arrays, e.g. numpy.save(path, np.asarray(x, dtype=np.float32))",
    )


class FeedChecker:
    """Checks blocks against the model's inputs and turns them into rows."""

    def __init__(self, inputs: list[InputInfo], batch_size: int,
                 batch_option: str | None = "--batch-size") -> None:
        self.inputs = inputs
        self.batch_size = batch_size
        self.batch_option = batch_option  # the caller's flag for it, None when it has none
        self.casts: set[str] = set()  # inputs whose float64 data is cast to float32
        self.whole = self._whole_inputs()
        self.static_batch = self._static_batch()
        self._row_params = {i.dims[0] for i in inputs if i.dims and isinstance(i.dims[0], str)}

    def _whole_inputs(self) -> set[str]:
        """Inputs whose static axis 0 is N > 1 while a run takes one sample (batch size
        1): recurrent state [2, N, 128] beside a batched input, or an image [3, H, W]
        with no batch axis. Each of their samples is the whole array, and their axis 0
        is not cut. (Data that fits only as N rows gets `_batch_error`.)"""
        if self.batch_size != 1:
            return set()
        return {i.name for i in self.inputs
                if i.dims and isinstance(i.dims[0], int) and i.dims[0] != 1}

    def _static_batch(self) -> int | None:
        """The rows every run must have, when some input fixes them (else None)."""
        fixed = None
        for info in self.inputs:
            if info.dims is None or (info.dims and not isinstance(info.dims[0], int)):
                continue
            if info.name in self.whole:
                continue
            rows = info.dims[0] if info.dims else 1
            if rows != self.batch_size:
                raise self._batch_error(info)
            fixed = rows
        return fixed

    def _batch_error(self, info: InputInfo) -> GraphfixError:
        """Input `info`'s static axis 0 (or its being a scalar) does not fit the batch size."""
        rows = info.dims[0] if info.dims else 1
        why = (f"its axis 0 is fixed at {rows}, so every run takes exactly {rows} "
               f"sample{'s' if rows > 1 else ''}" if info.dims
               else "it is a scalar, so samples cannot be stacked into batches")
        option = self.batch_option
        return GraphfixError(
            f"{option or 'A batch of'} {self.batch_size} does "
            f"not fit input '{info.name}' {show_dims(info.dims)}",
            why,
            (f"pass {option} {rows}" if option
             else f"give data whose samples fit a batch of {self.batch_size}")
            + (", or export the model with a dynamic batch axis" if info.dims else ""),
        )

    def check(self, where: str, headers: Mapping[str, Header]) -> Block:
        """The block's rows and sample shapes; GraphfixError when it does not fit."""
        self._check_names(where, headers)
        rows: dict[str, int] = {}
        shapes = []
        for info in self.inputs:
            shape, dtype = headers[info.name]
            self._check_dtype(where, info, dtype)
            rows[info.name], sample = self._rows(where, info, tuple(shape))
            shapes.append(sample)
        if len(set(rows.values())) > 1:
            counts = ", ".join(f"'{k}' {v}" for k, v in rows.items())
            raise GraphfixError(
                f"The arrays in '{where}' hold different numbers of samples ({counts})",
                "axis 0 counts samples, and each sample needs every input",
                "store the same number of samples for every input",
            )
        self._check_params(where, shapes)
        return Block(where, next(iter(rows.values())), tuple(shapes))

    def normalize(self, where: str, arrays: Mapping[str, Any]) -> tuple[dict, Block]:
        """Arrays with a sample axis and the model's dtypes, and their Block."""
        values = {}
        for name, value in arrays.items():
            try:
                values[name] = np.asarray(value)
            except Exception as err:  # whatever the object's __array__ raises
                raise GraphfixError(f"'{where}' has a value for '{name}' that is not an array",
                                    f"numpy says: {err}", "yield numpy arrays") from None
            if values[name].dtype.hasobject:
                raise GraphfixError(f"'{where}' has a value for '{name}' that is not a "
                                    "numeric array", "it holds Python objects",
                                    "yield numpy arrays of the model's dtypes")
        block = self.check(where, {k: (v.shape, v.dtype) for k, v in values.items()})
        out = {}
        for info, sample in zip(self.inputs, block.shapes, strict=True):
            arr = values[info.name]
            if info.name in self.casts and arr.dtype == np.float64:
                arr = arr.astype(np.float32)
            out[info.name] = arr[np.newaxis] if arr.ndim == len(sample) else arr
        return out, block

    def finish(self, batch: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
        """The feed dict for one run: static batch checked, scalar inputs unwrapped."""
        rows = len(next(iter(batch.values())))
        if self.static_batch is not None and rows != self.static_batch:
            raise GraphfixError(
                f"The last batch (ending in '{where}') has {rows} samples, but the model "
                f"takes exactly {self.static_batch} per run",
                "an input's axis 0 is static, so a smaller batch cannot run",
                f"use a number of samples divisible by {self.static_batch} (--max-samples)",
            )
        for info in self.inputs:
            if info.dims == ():
                batch[info.name] = batch[info.name].reshape(())
            elif info.name in self.whole:
                batch[info.name] = batch[info.name][0]
        return batch

    def rows(self, batch: Mapping[str, Any]) -> int:
        """Samples in a batch `finish` made: axis 0 of an input that has one as its
        sample axis; 1 when every input is whole or a scalar (a run of one sample)."""
        for info in self.inputs:
            if info.dims == () or info.name in self.whole:
                continue
            shape = np.shape(batch[info.name])
            return int(shape[0]) if shape else 1
        return 1

    def _check_names(self, where: str, headers: Mapping[str, Header]) -> None:
        names = [i.name for i in self.inputs]
        missing = [n for n in names if n not in headers]
        extra = [k for k in headers if k not in names]
        if not missing and not extra:
            return
        why = []
        if missing:
            why.append("it has no array for input " + ", ".join(f"'{n}'" for n in missing))
        if extra:
            why.append("it has " + ", ".join(f"'{k}'" for k in extra)
                       + ", which the model does not take")
        raise GraphfixError(
            f"'{where}' does not match the model's inputs ({', '.join(names)})",
            "; ".join(why),
            "key the arrays by the model's input names (for files: "
            "numpy.savez(path, **{name: array}))",
        )

    def _check_dtype(self, where: str, info: InputInfo, dtype: np.dtype) -> None:
        if dtype.hasobject:
            raise pickled(where)
        if info.dtype is None or dtype == info.dtype:
            return
        if dtype == np.float64 and info.dtype == np.float32:
            self.casts.add(info.name)
            return
        raise GraphfixError(
            f"The data for input '{info.name}' in '{where}' is {dtype}, but the model's "
            f"input is {info.dtype}",
            "only float64 data is cast (to float32); onnxruntime converts no types",
            f"save it with .astype('{info.dtype}')",
        )

    def _rows(self, where: str, info: InputInfo, shape: tuple[int, ...]
              ) -> tuple[int, tuple[int, ...]]:
        """(rows, sample shape) of one array; GraphfixError when it does not fit."""
        if info.dims is None:  # no declared shape: axis 0 counts samples
            if shape:
                return shape[0], shape[1:]
            raise self._shape_error(where, info, shape, "it has no axis 0 to count samples")
        rank = max(len(info.dims), 1)  # a scalar input takes [N] (N samples) or [] (one)
        skip = 1  # dims of the model's input before the sample's
        if info.name in self.whole:  # [N, *dims] (N samples) or dims (one)
            rank, skip = len(info.dims) + 1, 0
            if not self._fits(info.dims, shape) and self._fits(info.dims[1:], shape):
                raise self._batch_error(info)  # rows of a static batch, not whole samples
        if len(shape) not in (rank, rank - 1):
            raise self._shape_error(where, info, shape, f"its rank is {len(shape)}")
        rows, sample = (shape[0], shape[1:]) if len(shape) == rank else (1, shape)
        for axis, (d, v) in enumerate(zip(info.dims[skip:], sample, strict=True), skip):
            if isinstance(d, int) and d != v:
                problem = f"the model's dim {axis} is {d}, the data has {v} there"
                raise self._shape_error(where, info, shape, problem)
        return rows, sample

    @staticmethod
    def _fits(dims: tuple, shape: tuple[int, ...]) -> bool:
        """Whether `shape` is one sample of `dims` or a stack of them along axis 0."""
        sample = shape if len(shape) == len(dims) else shape[1:]
        return len(sample) == len(dims) and all(
            not isinstance(d, int) or d == v for d, v in zip(dims, sample, strict=True))

    def _shape_error(self, where: str, info: InputInfo, shape: tuple[int, ...],
                     problem: str) -> GraphfixError:
        sample = tuple(info.dims or ())[0 if info.name in self.whole else 1:]
        return GraphfixError(
            f"The data for input '{info.name}' in '{where}' has shape {show_shape(shape)}, "
            f"which does not fit the model's input {show_dims(info.dims)}",
            f"{problem}; an array holds one sample {show_dims(sample)} or samples stacked "
            f"along a leading axis {show_dims(('N', *sample))}",
            "save the data in the model's shape; only dims shown as '?' or named may vary",
        )

    def _check_params(self, where: str, shapes: list[tuple[int, ...]]) -> None:
        seen: dict[str, tuple[str, int]] = {}
        for info, sample in zip(self.inputs, shapes, strict=True):
            dims = (info.dims or ())[0 if info.name in self.whole else 1:]
            for d, v in zip(dims, sample, strict=False):
                if not isinstance(d, str) or d in self._row_params:
                    continue
                other = seen.setdefault(d, (info.name, v))
                if other[1] != v:
                    raise GraphfixError(
                        f"In '{where}', dim '{d}' is {other[1]} in '{other[0]}' but {v} in "
                        f"'{info.name}'",
                        f"the model names both dims '{d}', so they must have one size",
                        "make those dims agree in the data",
                    )


def check_batches(blocks: list[Block], start: int, stop: int, batch_size: int) -> None:
    """Blocks whose rows share a batch must have the same sample shapes (checked before
    any reading, for sources whose blocks are known)."""
    if batch_size == 1:
        return
    pos, last = 0, None  # last: (batch index, block) of the previous block in range
    for block in blocks:
        lo, hi = max(pos, start), min(pos + block.rows, stop)
        pos += block.rows
        if hi <= lo:
            continue
        first = (lo - start) // batch_size
        if last is not None and last[0] == first and last[1].shapes != block.shapes:
            raise _mixed(last[1], block)
        last = ((hi - 1 - start) // batch_size, block)


def _mixed(a: Block, b: Block) -> GraphfixError:
    index = next(i for i, (x, y) in enumerate(zip(a.shapes, b.shapes, strict=True)) if x != y)
    return GraphfixError(
        f"Samples from '{a.where}' and '{b.where}' cannot share a batch",
        f"model input {index + 1} is {show_shape(a.shapes[index])} in one and "
        f"{show_shape(b.shapes[index])} in the other; a batch stacks samples along axis 0, "
        "so their other dims must agree",
        "pass --batch-size 1, or bring the samples to one shape",
    )


def batches(
    blocks: Iterable[tuple[dict[str, np.ndarray], Block]],
    start: int,
    stop: int | None,
    checker: FeedChecker,
) -> Generator[dict[str, np.ndarray], None, int]:
    """Feed dicts of `checker.batch_size` rows (the last may be smaller) from rows
    [start, stop) of the blocks' rows; returns the rows the blocks held up to the end
    (or up to `stop`)."""
    size = checker.batch_size
    pending: list[tuple[dict[str, np.ndarray], Block]] = []
    have = pos = 0
    for arrays, block in blocks:
        lo = max(start - pos, 0)
        hi = block.rows if stop is None else min(block.rows, stop - pos)
        pos += block.rows
        while lo < hi:
            take = min(size - have, hi - lo)
            pending.append(({k: v[lo:lo + take] for k, v in arrays.items()}, block))
            have, lo = have + take, lo + take
            if have == size:
                yield checker.finish(_join(pending), block.where)
                pending, have = [], 0
        if stop is not None and pos >= stop:
            break
    if pending:
        yield checker.finish(_join(pending), pending[-1][1].where)
    return pos if stop is None else min(pos, stop)


def _join(pieces: list[tuple[dict[str, np.ndarray], Block]]) -> dict[str, np.ndarray]:
    if len(pieces) == 1:
        return {k: np.asarray(v) for k, v in pieces[0][0].items()}
    for (_, a), (_, b) in zip(pieces, pieces[1:], strict=False):
        if a.shapes != b.shapes:
            raise _mixed(a, b)
    return {k: np.concatenate([p[k] for p, _ in pieces]) for k in pieces[0][0]}
