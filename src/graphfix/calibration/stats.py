"""Streaming activation statistics for calibration, in onnxruntime.

`collect` runs the FP32 model with the tensors to calibrate exposed as graph
outputs and keeps, per tensor, min, max, amax = max|x| and a
histogram of |x| with `bins` equal bins on [0, amax]. Memory does not grow with
the number of samples: each batch is reduced and dropped.

One pass over the data (the default): each batch updates min/max and a histogram
of |x| on a fine grid of 2**15 buckets whose width is a power of two set by the
largest |x| so far (`_Acc`); a batch that raises the max merges buckets pairwise,
exactly. At the end every bucket goes to the `bins`-bin histogram on [0, amax] by
its centre. A value is then at most 1/16 of a bin (at 2048 bins) from where an
exact histogram on [0, amax] would put it, so only values that close to a bin edge
can be counted in the neighbouring bin. minmax, percentile and mse move by at
most a bin for it (test_stats); entropy's KL search need not: on a sparse tail
its minimum can jump between far-apart clip points when single counts move,
which is why `exact=True` exists.

onnxruntime runs with all its graph optimizations here (`make_session(fast=True)`):
an exposed tensor is a graph output, which no fusion removes, and its values equal
the unoptimized run's up to float rounding (other kernels, other summation order).
On ResNet-50 (2 cores) that took the statistics from 83 to 72 ms per sample, for
about 120 MB more peak memory (NCHWc reorders). Because which tensors are exposed
changes what can be fused, chunking (below) can move a value by that rounding.

`exact=True`, two passes (what TensorRT-faithful entropy uses), with onnxruntime's
optimizations off, so the values are graphfix's reference numbers: pass 1 finds the
range, pass 2 bins |x| with np.histogram on the final [0, amax], exactly the
histogram NVIDIA's entropy search is defined on. It costs a second run of the
model over the data.

Why the result does not depend on batch size or sample order, either way: min/max
are order free; the fine grid's buckets are floor(|x| / w) for a w fixed by the
final max alone (merging pairs of floor(v / 2**s) gives floor(v / 2**(s+1))), and
the exact histogram's edges are fixed by the final range. So min/max/amax/count/
hist are identical for any batching or order of the same samples, as long as
onnxruntime itself computes the same values per sample.

Memory: the tensors are split into chunks whose activations for one batch
(`activation_bytes`) fit `memory_budget`; each chunk runs its own pass(es)
with only its tensors as graph outputs. onnxruntime frees an intermediate after
its last reader, so a run holds about the exposed tensors plus the few tensors
in flight. A single tensor larger than the budget runs alone (a note says so).
The budget bounds the exposed activations; the process peak is a small multiple
of it (onnxruntime's output buffers, the arrays handed to Python, one |x|
temporary, and the fine grids: 256 KiB per tensor of the chunk). Measured on a
chain of 40 tensors of 40 MB each (with the two-pass collection): peak RSS growth
4.1 GB unchunked, 0.6 GB with a 200 MB budget (8 chunks), 0.24 GB with 40 MB.
Each chunk costs more runs over the data.

Skipped tensors are not in the result; `Collected.skipped` says why for each:
non-float types, tensors inside If/Loop/Scan bodies (an ONNX graph output can
only name a main-graph tensor), initializers (weights are not calibrated), and
tensors whose type shape inference cannot tell.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
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


STEP_THREADS = 2  # threads that reduce one batch's tensors (see _Run.run)
CHUNK = 1 << 18  # values binned at a time: the keys (2 MiB) stay in cache, memory stays flat
FINE_BITS = 15  # fine buckets per tensor: 2**15, 8 to 16 per histogram bin at 2048 bins


_local = threading.local()


def _scratch(size: int) -> np.ndarray:
    """This thread's buffer for bucket keys, reused across tensors and batches: a
    fresh array per tensor costs a page fault per 4 KiB, which is measurable here."""
    keys = getattr(_local, "keys", None)
    if keys is None or keys.size < size:
        keys = _local.keys = np.empty(max(size, 1), np.intp)
    return keys


@dataclass
class _Acc:
    """Running statistics of one tensor, updated batch by batch in one pass.

    The histogram is kept on a fine grid that does not need the final range:
    bucket k counts the |x| with floor(|x| / w) == k, w = 2**(exp - fine_bits),
    where exp is the binary exponent of the largest |x| so far (every |x| < 2**exp).
    When a later batch raises exp by d, pairs of buckets merge d times over
    (w doubles, still a power of two), which is exactly the grid that batch's exp
    would have given from the start. So the fine counts, like min/max, do not
    depend on the order or batching of the samples. `result` maps each bucket to
    the `bins`-bin histogram on [0, amax] by its centre.
    """

    fine_bits: int
    dtype: np.dtype | None = None
    lo: float = math.inf
    hi: float = -math.inf
    count: int = 0
    nonfinite: int = 0
    exp: int | None = None
    fine: np.ndarray | None = field(default=None, repr=False)
    hist: np.ndarray | None = field(default=None, repr=False)  # exact collection only

    @property
    def amax(self) -> float:
        return max(abs(self.lo), abs(self.hi)) if self.count else 0.0

    def add(self, arr: np.ndarray, histogram: bool) -> None:
        self.dtype = self.dtype or arr.dtype
        if arr.size == 0:
            return
        if arr.dtype == np.float16:
            arr = arr.astype(np.float32)
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
        if histogram:
            self._bin(arr, max(-float(lo), float(hi)))

    def add_exact(self, arr: np.ndarray, bins: int) -> None:
        """Second pass of `exact` collection: np.histogram of |x| on the final [0, amax]."""
        if self.hist is None:
            self.hist = np.zeros(bins, np.int64)
        values = np.abs(arr.astype(np.float32) if arr.dtype == np.float16 else arr).ravel()
        if self.nonfinite:
            values = values[np.isfinite(values)]
        if self.amax == 0:
            self.hist[0] += values.size
        else:
            self.hist += np.histogram(values, bins=bins, range=(0.0, self.amax))[0]

    def _bin(self, values: np.ndarray, amax: float) -> None:
        size = 1 << self.fine_bits
        if self.fine is None:
            self.fine = np.zeros(size, np.int64)
        if amax == 0:
            self.fine[0] += values.size
            return
        exp = math.frexp(amax)[1]  # amax < 2**exp
        if self.exp is None or exp > self.exp:
            self._grow(exp)
        shift = self.fine_bits - self.exp  # |x| * 2**shift < 2**fine_bits, exactly
        if values.dtype == np.float32 and abs(shift) > 120:
            values = values.astype(np.float64)  # 2**shift outside float32's range
        scale = values.dtype.type(2.0**shift)
        flat = values.reshape(-1)
        keys = _scratch(min(flat.size, CHUNK))
        for start in range(0, flat.size, CHUNK):
            part = flat[start:start + CHUNK]
            out = keys[:part.size]
            # the cast truncates toward zero, so abs afterwards gives floor(|x| * 2**shift)
            np.multiply(part, scale, out=out, casting="unsafe")
            np.abs(out, out=out)
            self.fine += np.bincount(out, minlength=size)

    def _grow(self, exp: int) -> None:
        """Coarsen the fine grid for a larger exponent: merge 2**(exp - self.exp)
        buckets into one (the counts at zero-width exp None are all in bucket 0)."""
        if self.exp is not None:
            step = exp - self.exp
            total = int(self.fine.sum())
            if step >= self.fine_bits:
                self.fine[:] = 0
                self.fine[0] = total
            else:
                merged = self.fine.reshape(-1, 1 << step).sum(axis=1)
                self.fine[:] = 0
                self.fine[:merged.size] = merged
        self.exp = exp

    def histogram(self, bins: int) -> np.ndarray:
        """The counts of |x| over `bins` equal bins on [0, amax], each fine bucket
        put in the bin that holds its centre (so a value moves by at most half a
        bucket, 1/16 of a bin at 2048 bins, from where an exact histogram puts it)."""
        if self.hist is not None:
            return self.hist
        if self.fine is None:
            return np.zeros(bins, np.int64)
        if self.exp is None or self.amax == 0:
            out = np.zeros(bins, np.int64)
            out[0] = int(self.fine.sum())
            return out
        centres = (np.arange(self.fine.size) + 0.5) * 2.0 ** (self.exp - self.fine_bits)
        where = np.minimum((centres * (bins / self.amax)).astype(np.intp), bins - 1)
        counts = np.bincount(where, weights=self.fine.astype(np.float64), minlength=bins)
        return np.rint(counts).astype(np.int64)

    def result(self, name: str, bins: int) -> TensorStats:
        return TensorStats(
            name=name, dtype=np.dtype(self.dtype or np.float32),
            min=self.lo if self.count else 0.0, max=self.hi if self.count else 0.0,
            amax=self.amax, hist=self.histogram(bins), count=self.count,
            nonfinite=self.nonfinite,
        )


def fine_bits(bins: int) -> int:
    """Fine buckets (as a power of two) for `bins` histogram bins: at least 8 per bin."""
    return max(FINE_BITS, (bins - 1).bit_length() + 4)


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
    producers: dict[str, onnx.NodeProto] | None = None  # made when a type is unknown
    for t in dict.fromkeys(tensors):
        elem = info.get(t, (0, None))[0]
        if t in inits and t not in main:
            skipped[t] = "an initializer (weights get scales from their values, not calibration)"
        elif t not in main:
            skipped[t] = "inside an If/Loop/Scan body, which cannot be exposed as a graph output"
        elif not elem:
            if producers is None:
                producers = {o: n for n in g.node for o in n.output}
            skipped[t] = "its type is unknown after shape inference" + _foreign(producers.get(t))
        elif elem not in FLOAT_TYPES:
            skipped[t] = f"not a float tensor ({helper.tensor_dtype_to_string(elem)})"
        else:
            keep.append(t)
    return keep, skipped


def _foreign(node: onnx.NodeProto | None) -> str:
    """Why shape inference could not type a tensor `node` made, when it is an op outside
    the ONNX domain (onnxruntime's transformer optimizer writes com.microsoft fused ops)."""
    if node is None or node.domain in ("", "ai.onnx"):
        return ""
    return (f" (it comes from {node.domain} {node.op_type}, which ONNX does not know; "
            "`graphfix run MODEL` writes onnxruntime's fused ops as standard ones: its "
            "unfuse-contrib pass)")


def _hint(data: object) -> str:
    hint = getattr(data, "hint", None)
    return hint() if callable(hint) else ""


def batch_samples(feeds: dict[str, np.ndarray], data: object = None) -> int:
    """Samples in one batch of `data`: as `data.rows` counts them where it can (an
    input without a batch axis, an image [3, H, W], is one sample a run), else the
    leading dim of the batch's first input (1 for scalars)."""
    rows = getattr(data, "rows", None)
    if callable(rows):
        return int(rows(feeds))
    first = next(iter(feeds.values()), None)
    shape = np.shape(first) if first is not None else ()
    return int(shape[0]) if shape else 1


def total_samples(data: Iterable[dict[str, np.ndarray]]) -> int:
    """How many samples `data` holds, when it can tell (0 when not)."""
    if hasattr(data, "num_samples"):
        return int(data.num_samples)
    if isinstance(data, Sequence):
        return sum(batch_samples(f) for f in data)
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
                "it was exported for)" + _hint(self.data)) from None

    def _next(self, batches: Iterator[dict[str, np.ndarray]], done: int):
        """The next batch and its exposed tensors (None after the last batch)."""
        feeds = next(batches, None)
        if feeds is None:
            return None
        return feeds, (self._run(feeds, done) if self.exposed else [])

    def run(self, phase: str, step: Callable[[str, np.ndarray], None]) -> int:
        """One pass; `step(name, array)` gets every tensor of every batch. Returns
        the samples seen.

        Two things overlap here. The tensors of a batch are reduced by STEP_THREADS
        threads (numpy's ufuncs release the GIL), each tensor by one thread: `step` must
        touch only that tensor's state. And while they reduce batch k, one more thread
        reads batch k+1 and runs onnxruntime on it, so the cores onnxruntime leaves idle
        (between its small ops, and while a batch is read from disk) do the reduction.
        The cost: two batches' tensors are alive at once. Measured on ResNet-50, 2 cores:
        see bench/RESULTS.md (issue 13)."""
        done = 0
        if self.progress:
            self.progress(phase, 0, self.total)
        batches = iter(self.data)
        with ThreadPoolExecutor(STEP_THREADS) as pool, ThreadPoolExecutor(1) as ahead:
            coming = ahead.submit(self._next, batches, done)
            while (item := coming.result()) is not None:
                feeds, outputs = item
                samples = batch_samples(feeds, self.data)
                coming = ahead.submit(self._next, batches, done + samples)
                pairs = [(name, np.asarray(feeds[name])) for name in self.inputs]
                pairs += zip(self.exposed, outputs, strict=True)
                del item, outputs
                for _ in pool.map(lambda pair: step(*pair), pairs):
                    pass
                del pairs
                done += samples
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
    exact: bool = False,
) -> Collected:
    """Statistics of `tensors` over every batch of `data` (re-iterated once per pass).

    `data` yields feed dicts {input name: array}, the same batches each time it
    is iterated. `progress(phase, done, total)` is called after every batch;
    `phase` reads "pass 2/4: histogram (12 tensors)", done/total count samples
    (total is 0 when `data` cannot tell its size). See the module docstring for
    the method; the result holds only float tensors, `.skipped` the others.
    `histograms=False` keeps only the ranges (minmax needs nothing else): every
    `hist` is then all zeros. `exact=True` makes two passes per chunk, the range
    first and then np.histogram on [0, amax], for methods that must see exactly
    TensorRT's histogram (see the module docstring).
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
    sizes = activation_bytes(model, keep, dict(first), info)
    result.chunks, result.notes = chunk_tensors(keep, sizes, memory_budget)
    inputs = {vi.name for vi in model.graph.input} & set(first)
    total = total_samples(data)
    per_chunk = 2 if exact and histograms else 1
    npasses = per_chunk * len(result.chunks)
    bits = fine_bits(bins)
    for c, chunk in enumerate(result.chunks):
        accs = {t: _Acc(bits) for t in chunk}
        session = None
        exposed = [t for t in chunk if t not in inputs]
        if exposed:
            session = make_session(exposed_model(model, exposed, info), providers,
                                   fast=not exact)
        run = _Run(session, [t for t in chunk if t in inputs], exposed, data, total, progress,
                   model)
        label = _plural(len(chunk), "tensor")
        first_pass = "range" if per_chunk == 2 else "statistics"
        result.samples = run.run(_phase(per_chunk * c + 1, npasses, f"{first_pass} ({label})"),
                                 lambda n, a, accs=accs: accs[n].add(a, histograms and
                                                                     not exact))
        if per_chunk == 2:
            run.run(_phase(per_chunk * c + 2, npasses, f"histogram ({label})"),
                    lambda n, a, accs=accs: accs[n].add_exact(a, bins))
        del run, session
        for t in chunk:
            result[t] = accs[t].result(t, bins)
    result.passes = npasses
    result.seconds = time.perf_counter() - start
    return result


def _phase(number: int, passes: int, what: str) -> str:
    return what if passes == 1 else f"pass {number}/{passes}: {what}"
