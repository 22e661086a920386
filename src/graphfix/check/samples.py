"""The inputs `graphfix check` runs both models on: the user's data or seeded random samples."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from itertools import islice

import numpy as np
import onnx

from graphfix.runtime.feeds import (
    graph_inputs,
    model_feeds,
    refuse_non_tensors,
    resolve_shapes,
)
from graphfix.runtime.tolerances import Tolerance, tolerance_for


def check_samples(model: onnx.ModelProto, data: str | os.PathLike | None, data_key: str | None,
                  input_shapes: Mapping[str, Sequence[int]], count: int, seed: int,
                  values: Mapping[str, Sequence[float | int]] | None = None,
                  preprocess: str | None = None) -> list[dict[str, np.ndarray]]:
    """`count` samples (one run's batch each: 1, or the model's static batch): the first
    ones of `data` (anything `graphfix calibrate --data` reads, image folders with
    `preprocess`, its --preprocess text; its shapes, no
    `input_shapes` needed), else seeded random inputs (`runtime.feeds.model_feeds`:
    `values` fixes inputs), sample i with seed+i, dynamic dims from `input_shapes`
    ({name: dims}) or the usual defaults."""
    refuse_non_tensors(model)
    if data is not None:
        from graphfix.runtime.data import open_runs
        from graphfix.runtime.values import with_values

        source = open_runs(data, model, data_key=data_key, runs=count, preprocess=preprocess)
        return [with_values(model, feeds, values) for feeds in islice(iter(source), count)]
    inputs = graph_inputs(model)
    shapes = resolve_shapes(inputs, {k: tuple(v) for k, v in input_shapes.items()})
    return [model_feeds(model, shapes, seed + i, values) for i in range(count)]


def tolerance_override(atol: float | None, rtol: float | None) -> Tolerance | None:
    """--atol/--rtol for float tensors: a plain elementwise bound |c - r| <= atol + rtol |r|
    (the scale-relative part of the default verdict is off); the fp32 default fills the
    one not given."""
    if atol is None and rtol is None:
        return None
    default = tolerance_for("float32")
    return Tolerance(rtol if rtol is not None else default.rtol,
                     atol if atol is not None else default.atol, scale=0.0)
