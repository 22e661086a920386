"""How close a Q/DQ model's outputs are to the FP32 model's: SQNR, top-1 agreement, accuracy.

All from onnxruntime on CPU with graph optimizations disabled (graphfix's reference
for "same numbers"), on held-apart samples that calibration did not see.

- SQNR (dB) of each output over all samples: 10 log10(sum(ref^2) / sum((ref - q)^2));
  the reported number is the first output's (infinite when identical).
- top-1 agreement: the share of samples whose argmax over the last axis of the first
  output is the same in both models (meaningful for classifiers).
- accuracy: the share of samples whose argmax equals the label, when labels are given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from graphfix.runtime.measure import ratio_db
from graphfix.runtime.session import make_session


@dataclass
class Agreement:
    samples: int
    sqnr_db: float
    top1_agreement: float
    accuracy: float | None = None
    reference_accuracy: float | None = None

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isinf(v) else v)
                for k, v in self.__dict__.items()}


def compare(
    reference: onnx.ModelProto,
    candidate: onnx.ModelProto,
    data: Iterable[dict[str, np.ndarray]],
    labels: np.ndarray | None = None,
    providers: Sequence[str] = ("cpu",),
) -> Agreement:
    """Run both models batch by batch (memory: one batch of outputs at a time)."""
    ref_session, cand_session = make_session(reference, providers), make_session(candidate,
                                                                                providers)
    signal = noise = 0.0
    agree = correct = ref_correct = samples = 0
    for feeds in data:
        ref = _first_output(ref_session, feeds)
        out = _first_output(cand_session, feeds)
        ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
        signal += float(np.sum(ref64 * ref64))
        noise += float(np.sum((ref64 - out64) ** 2))
        ref_top = ref.reshape(ref.shape[0], -1).argmax(axis=-1) if ref.ndim > 1 else ref
        out_top = out.reshape(out.shape[0], -1).argmax(axis=-1) if out.ndim > 1 else out
        agree += int(np.sum(ref_top == out_top))
        if labels is not None:
            batch_labels = labels[samples:samples + len(out_top)].reshape(-1)
            correct += int(np.sum(out_top == batch_labels))
            ref_correct += int(np.sum(ref_top == batch_labels))
        samples += len(out_top)
    if samples == 0:
        return Agreement(0, float("nan"), float("nan"))
    result = Agreement(samples, ratio_db(signal, noise), agree / samples)
    if labels is not None:
        result.accuracy, result.reference_accuracy = correct / samples, ref_correct / samples
    return result


def _first_output(session, feeds: dict[str, np.ndarray]) -> np.ndarray:
    name = session.get_outputs()[0].name
    return np.asarray(session.run([name], dict(feeds))[0])
