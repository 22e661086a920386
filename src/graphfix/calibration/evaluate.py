"""How close Q/DQ models' outputs are to the FP32 model's: SQNR, top-1 agreement, accuracy.

All from onnxruntime with graph optimizations disabled (graphfix's reference for "same
numbers"), on held-apart samples that calibration did not see. `compare_many` runs the
FP32 model once per batch and every candidate on the same batch, so `--method all`
costs one FP32 run, not one per method; memory is one batch of outputs at a time.

- SQNR (dB) per float output over all samples: 10 log10(sum(ref^2) / sum((ref - q)^2));
  the reported number is the lowest over the outputs (+inf when identical). An output
  that is the same for every sample (a head initialised to zero) carries no signal: it
  is left out and named in `constant_outputs`; with no other output, SQNR is NaN.
- top-1 agreement: for a classifier only (first output 2-D, [N, classes >= 2]), the
  share of samples whose argmax is the same in both models; None otherwise.
- accuracy: the share of samples whose argmax of the first output equals the label,
  when labels are given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from graphfix.calibration.stats import batch_samples, total_samples
from graphfix.runtime.measure import ratio_db
from graphfix.runtime.session import make_session


@dataclass
class Agreement:
    samples: int
    sqnr_db: float
    top1_agreement: float | None
    accuracy: float | None = None
    reference_accuracy: float | None = None
    constant_outputs: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and (math.isinf(v) or math.isnan(v)) else v)
                for k, v in self.__dict__.items()}


@dataclass
class _Tally:
    outputs: list[str]
    signal: np.ndarray = field(init=False)
    noise: np.ndarray = field(init=False)
    agree: int = 0
    correct: int = 0

    def __post_init__(self) -> None:
        self.signal = np.zeros(len(self.outputs))
        self.noise = np.zeros(len(self.outputs))


def compare_many(
    reference: onnx.ModelProto,
    candidates: Mapping[str, onnx.ModelProto],
    data: Iterable[dict[str, np.ndarray]],
    labels: np.ndarray | None = None,
    providers: Sequence[str] = ("cpu",),
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Agreement]:
    """Agreement of every candidate with `reference`, batch by batch (see the module
    docstring). The candidates must have the reference's outputs."""
    ref_session = make_session(reference, providers)
    outputs = [o.name for o in ref_session.get_outputs()]
    sessions = {k: make_session(m, providers) for k, m in candidates.items()}
    tallies = {k: _Tally(outputs) for k in candidates}
    first: list[np.ndarray | None] = [None] * len(outputs)
    constant = [True] * len(outputs)
    samples = ref_correct = 0
    classifier = True
    total = total_samples(data)
    for feeds in data:
        n = batch_samples(feeds, data)
        refs = [np.asarray(r) for r in ref_session.run(outputs, dict(feeds))]
        floats = [r.dtype.kind == "f" for r in refs]
        for i, r in enumerate(refs):
            if floats[i] and r.size and r.ndim:
                r = _rows(r, n)
                if first[i] is None:
                    first[i] = r[:1].copy()
                constant[i] = constant[i] and r.shape[1:] == first[i].shape[1:] and \
                    bool(np.all(r == first[i]))
        head = _rows(refs[0], n)
        classifier = classifier and head.ndim == 2 and head.shape[1] >= 2
        ref_top = _top1(head)
        batch_labels = None
        if labels is not None:
            batch_labels = labels[samples:samples + n].reshape(-1)
            ref_correct += int(np.sum(ref_top == batch_labels))
        for key, session in sessions.items():
            tally = tallies[key]
            outs = session.run(outputs, dict(feeds))
            for i, (r, q) in enumerate(zip(refs, outs, strict=True)):
                if floats[i]:
                    r64, q64 = r.astype(np.float64), np.asarray(q, np.float64)
                    tally.signal[i] += float(np.sum(r64 * r64))
                    tally.noise[i] += _noise(r64, q64)
            top = _top1(_rows(np.asarray(outs[0]), n))
            tally.agree += int(np.sum(top == ref_top)) if top.shape == ref_top.shape else 0
            if batch_labels is not None:
                tally.correct += int(np.sum(top == batch_labels))
        samples += n
        if progress:
            progress("evaluating on held-apart samples", samples, max(total, samples))
    if samples == 0:
        return {k: Agreement(0, float("nan"), None) for k in candidates}
    if samples < 2:  # one sample is always "the same for every sample"
        constant = [False] * len(outputs)
    compared = [i for i in range(len(outputs)) if first[i] is not None and not constant[i]]
    flat = [outputs[i] for i in range(len(outputs)) if first[i] is not None and constant[i]]
    out = {}
    for key, tally in tallies.items():
        sqnr = min((ratio_db(tally.signal[i], tally.noise[i]) for i in compared),
                   default=float("nan"))
        result = Agreement(samples, sqnr, tally.agree / samples if classifier else None,
                           constant_outputs=flat)
        if labels is not None:
            result.accuracy, result.reference_accuracy = tally.correct / samples, \
                ref_correct / samples
        out[key] = result
    return out


def compare(reference: onnx.ModelProto, candidate: onnx.ModelProto,
            data: Iterable[dict[str, np.ndarray]], labels: np.ndarray | None = None,
            providers: Sequence[str] = ("cpu",)) -> Agreement:
    """`compare_many` with one candidate."""
    return compare_many(reference, {"candidate": candidate}, data, labels, providers)["candidate"]


def _rows(out: np.ndarray, n: int) -> np.ndarray:
    """An output with one row per sample of a batch of `n`: as it is when its axis 0
    counts them; else (a detector's boxes [300, 4] for one image) as one row."""
    return out if out.ndim and out.shape[0] == n else out[np.newaxis]


def _noise(ref: np.ndarray, got: np.ndarray) -> float:
    """sum((ref - got)^2). When a detector's INT8 model keeps another number of rows
    (detections above its score threshold), the rows both have are compared and every
    other row counts whole; outputs of other shapes count whole."""
    if ref.shape == got.shape:
        return float(np.sum((ref - got) ** 2))
    if ref.ndim and ref.ndim == got.ndim and ref.shape[1:] == got.shape[1:]:
        k = min(len(ref), len(got))
        return float(np.sum((ref[:k] - got[:k]) ** 2) + np.sum(ref[k:] ** 2)
                     + np.sum(got[k:] ** 2))
    return float(np.sum(ref * ref) + np.sum(got * got))


def _top1(out: np.ndarray) -> np.ndarray:
    if out.ndim > 1 and out.size == 0:  # a detector's rows when it found nothing
        return np.full(out.shape[0], -1)
    return out.reshape(out.shape[0], -1).argmax(axis=-1) if out.ndim > 1 else out
