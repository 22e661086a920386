"""Streaming activation statistics for calibration, in onnxruntime.

`collect` runs the FP32 model with the tensors to calibrate exposed as graph
outputs (onnxruntime with its graph optimizations disabled, `runtime.session`, so
no tensor is fused away) and keeps, per tensor, min, max, amax = max|x| and a
histogram of |x| with `bins` equal bins on [0, amax]. Memory does not grow with
the number of samples: each batch is reduced and dropped.

Why the result does not depend on batch size or sample order: pass 1 (range)
keeps only min/max over all elements, which are order free. Pass 2 bins |x|
with fixed edges on [0, amax] (np.histogram with the same range for every
batch decides each element's bin by its value alone) and adds the counts. So
min/max/amax/count/hist are identical for any batching or order of the same
samples, as long as onnxruntime itself computes the same values per sample.

Memory: the tensors are split into chunks whose activations for one batch
(`activation_bytes`) fit `memory_budget`; each chunk runs its own two passes
with only its tensors as graph outputs. onnxruntime frees an intermediate after
its last reader, so a run holds about the exposed tensors plus the few tensors
in flight. A single tensor larger than the budget runs alone (a note says so).
The budget bounds the exposed activations; the process peak is a small multiple
of it (onnxruntime's output buffers, the arrays handed to Python, one |x|
temporary). Measured on a chain of 40 tensors of 40 MB each: peak RSS growth
4.1 GB unchunked, 0.6 GB with a 200 MB budget (8 chunks), 0.24 GB with 40 MB.
Each chunk costs two more runs over the data.

Skipped tensors are not in the result; `Collected.skipped` says why for each:
non-float types, tensors inside If/Loop/Scan bodies (an ONNX graph output can
only name a main-graph tensor), initializers (weights are not calibrated), and
tensors whose type shape inference cannot tell.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from graphfix.errors import GraphfixError
from graphfix.graph.protos import graph_protos
from graphfix.runtime.expose import (
    activation_bytes,
    chunk_tensors,
    exposed_model,
    infer_tensor_info,
)
from graphfix.runtime.session import make_session

Progress = Callable[[str, int, int], None]
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)


@dataclass
class TensorStats:
    """Statistics of one tensor over all calibration samples.

    `hist` holds int64 counts of |x| over `bins` equal bins on [0, amax] (the
    last bin includes amax); with amax == 0 every element is in bin 0.
    Non-finite elements (NaN, inf) are left out of everything and counted in
    `nonfinite`; `count` is the number of finite elements seen.
    """

    name: str
    dtype: np.dtype
    min: float
    max: float
    amax: float
    hist: np.ndarray
    count: int
    nonfinite: int = 0

    @property
    def bins(self) -> int:
        return int(self.hist.size)

    @property
    def edges(self) -> np.ndarray:
        """The bins+1 histogram edges, float64: linspace(0, amax, bins+1)."""
        return np.linspace(0.0, float(self.amax), self.bins + 1)


class Collected(dict[str, TensorStats]):
    """`collect`'s result: name -> TensorStats for every float tensor collected,
    plus what a report needs: `skipped` (name -> reason), `chunks` (tensor names
    per onnxruntime session), `notes`, `samples`, `passes` and `seconds`."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped: dict[str, str] = {}
        self.chunks: list[list[str]] = []
        self.notes: list[str] = []
        self.samples = 0
        self.passes = 0
        self.seconds = 0.0

    def summary(self) -> str:
        """One line for the end of a run."""
        text = (f"collected {_plural(len(self), 'tensor')} over {_plural(self.samples, 'sample')}"
                f" in {_plural(self.passes, 'pass')} ({_plural(len(self.chunks), 'chunk')}),"
                f" {self.seconds:.1f} s")
        if self.skipped:
            text += f"; skipped {len(self.skipped)}"
        return text


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}{'es' if word.endswith('s') else 's'}"


@dataclass
class _Acc:
    """Running state of one tensor across the two passes."""

    dtype: np.dtype | None = None
    lo: float = math.inf
    hi: float = -math.inf
    count: int = 0
    nonfinite: int = 0
    hist: np.ndarray | None = field(default=None, repr=False)

    @property
    def amax(self) -> float:
        return max(abs(self.lo), abs(self.hi)) if self.count else 0.0

    def add_range(self, arr: np.ndarray) -> None:
        self.dtype = self.dtype or arr.dtype
        if arr.size == 0:
            return
        lo, hi = arr.min(), arr.max()
        if not (np.isfinite(lo) and np.isfinite(hi)):
            finite = np.isfinite(arr)
            self.nonfinite += int(arr.size - np.count_nonzero(finite))
            arr = arr[finite]
            if arr.size == 0:
                return
            lo, hi = arr.min(), arr.max()
        self.lo, self.hi = min(self.lo, float(lo)), max(self.hi, float(hi))
        self.count += int(arr.size)

    def add_hist(self, arr: np.ndarray, bins: int) -> None:
        if self.hist is None:
            self.hist = np.zeros(bins, np.int64)
        values = np.abs(arr.astype(np.float32) if arr.dtype == np.float16 else arr).ravel()
        if self.nonfinite:
            values = values[np.isfinite(values)]
        amax = self.amax
        if amax == 0:
            self.hist[0] += values.size
        else:
            self.hist += np.histogram(values, bins=bins, range=(0.0, amax))[0]

    def result(self, name: str, bins: int) -> TensorStats:
        hist = self.hist if self.hist is not None else np.zeros(bins, np.int64)
        return TensorStats(
            name=name, dtype=np.dtype(self.dtype or np.float32),
            min=self.lo if self.count else 0.0, max=self.hi if self.count else 0.0,
            amax=self.amax, hist=hist, count=self.count, nonfinite=self.nonfinite,
        )


def _classify(model, tensors, info, fed) -> tuple[list[str], dict[str, str]]:
    """Split the requested tensors into collectable float tensors and skipped ones.
    `fed` are the input names the data provides (an initializer listed as a graph
    input counts as an input only when the data feeds it)."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    main = {o for n in g.node for o in n.output}
    main |= {vi.name for vi in g.input if vi.name not in inits or vi.name in fed}
    inner = {o for sub in list(graph_protos(g))[1:] for n in sub.node for o in n.output}
    inner |= {vi.name for sub in list(graph_protos(g))[1:] for vi in sub.input}
    unknown = [t for t in tensors if t not in main | inits | inner]
    if unknown:
        shown = ", ".join(f"'{t}'" for t in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise GraphfixError(
            f"{len(unknown)} tensor(s) to calibrate are not in the model: {shown}",
            "calibration reads tensors by their ONNX names",
            "check the names (graphfix keeps names across its rewrites)",
        )
    keep: list[str] = []
    skipped: dict[str, str] = {}
    for t in dict.fromkeys(tensors):
        elem = info.get(t, (0, None))[0]
        if t in inits and t not in main:
            skipped[t] = "an initializer (weights get scales from their values, not calibration)"
        elif t not in main:
            skipped[t] = "inside an If/Loop/Scan body, which cannot be exposed as a graph output"
        elif not elem:
            skipped[t] = "its type is unknown after shape inference"
        elif elem not in FLOAT_TYPES:
            skipped[t] = f"not a float tensor ({helper.tensor_dtype_to_string(elem)})"
        else:
            keep.append(t)
    return keep, skipped


def _samples(feeds: dict[str, np.ndarray]) -> int:
    """Samples in one batch: the leading dim of its first input (1 for scalars)."""
    first = next(iter(feeds.values()), None)
    shape = np.shape(first) if first is not None else ()
    return int(shape[0]) if shape else 1


def _total_samples(data: Iterable[dict[str, np.ndarray]]) -> int:
    if hasattr(data, "num_samples"):
        return int(data.num_samples)
    if isinstance(data, Sequence):
        return sum(_samples(f) for f in data)
    return 0


@dataclass
class _Run:
    """Passes over the data with one session: `inputs` are read from the feeds,
    `exposed` from the session's outputs."""

    session: object | None
    inputs: list[str]
    exposed: list[str]
    data: Iterable[dict[str, np.ndarray]]
    total: int
    progress: Progress | None
    model: onnx.ModelProto | None = None  # the calibrated model, to say what failed

    def _run(self, feeds: dict[str, np.ndarray], done: int) -> list:
        try:
            return self.session.run(self.exposed, dict(feeds))
        except Exception as err:  # onnxruntime raises many types: the data does not fit
            from graphfix.runtime.failures import explain

            why, _ = explain(self.model, feeds, err) if self.model is not None else (str(err), "")
            raise GraphfixError(
                f"onnxruntime cannot run the model on the calibration batch that starts at "
                f"sample {done + 1}",
                why, "give calibration data the model accepts (the values, ranges and dtypes "
                "it was exported for)") from None

    def run(self, phase: str, step: Callable[[str, np.ndarray], None]) -> int:
        """One pass; `step(name, array)` gets every tensor of every batch. Returns
        the samples seen."""
        done = 0
        if self.progress:
            self.progress(phase, 0, self.total)
        for feeds in self.data:
            for name in self.inputs:
                step(name, np.asarray(feeds[name]))
            if self.exposed:
                arrays = self._run(feeds, done)
                for name, arr in zip(self.exposed, arrays, strict=True):
                    step(name, arr)
            done += _samples(feeds)
            if self.progress:
                total = self.total if self.total == 0 or self.total >= done else done
                self.progress(phase, done, total)
        return done


def collect(
    model: onnx.ModelProto,
    tensors: Sequence[str],
    data: Iterable[dict[str, np.ndarray]],
    *,
    bins: int = 2048,
    memory_budget: int | None = None,
    providers: Sequence[str] = ("cpu",),
    progress: Progress | None = None,
    histograms: bool = True,
) -> Collected:
    """Statistics of `tensors` over every batch of `data` (re-iterated once per pass).

    `data` yields feed dicts {input name: array}, the same batches each time it
    is iterated. `progress(phase, done, total)` is called after every batch;
    `phase` reads "pass 2/4: histogram (12 tensors)", done/total count samples
    (total is 0 when `data` cannot tell its size). See the module docstring for
    the method; the result holds only float tensors, `.skipped` the others.
    `histograms=False` skips pass 2 (minmax needs only the range): every `hist`
    is then all zeros.
    """
    if bins < 1:
        raise ValueError("bins must be positive")
    start = time.perf_counter()
    first = next(iter(data), None)
    if first is None:
        raise GraphfixError("The calibration data is empty", "there is no batch to run",
                            "point --data at a folder or file with at least one sample")
    info = infer_tensor_info(model, dict(first))
    keep, skipped = _classify(model, tensors, info, set(first))
    result = Collected()
    result.skipped = skipped
    sizes = activation_bytes(model, keep, dict(first))
    result.chunks, result.notes = chunk_tensors(keep, sizes, memory_budget)
    inputs = {vi.name for vi in model.graph.input} & set(first)
    total = _total_samples(data)
    per_chunk = 2 if histograms else 1
    npasses = per_chunk * len(result.chunks)
    for c, chunk in enumerate(result.chunks):
        accs = {t: _Acc() for t in chunk}
        session = None
        exposed = [t for t in chunk if t not in inputs]
        if exposed:
            session = make_session(exposed_model(model, exposed, info), providers)
        run = _Run(session, [t for t in chunk if t in inputs], exposed, data, total, progress,
                   model)
        label = _plural(len(chunk), "tensor")
        result.samples = run.run(f"pass {per_chunk * c + 1}/{npasses}: range ({label})",
                                 lambda n, a, accs=accs: accs[n].add_range(a))
        if histograms:
            run.run(f"pass {2 * c + 2}/{npasses}: histogram ({label})",
                    lambda n, a, accs=accs: accs[n].add_hist(a, bins))
        del run, session
        for t in chunk:
            result[t] = accs[t].result(t, bins)
    result.passes = npasses
    result.seconds = time.perf_counter() - start
    return result
