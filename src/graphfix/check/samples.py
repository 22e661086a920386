"""The inputs `graphfix check` runs both models on: the user's data or seeded random samples."""

from __future__ import annotations

import os
from collections.abc import Sequence
from itertools import islice

import numpy as np
import onnx

from graphfix.runtime.feeds import graph_inputs, parse_input_shape, random_feeds, resolve_shapes
from graphfix.runtime.tolerances import Tolerance, tolerance_for


def check_samples(model: onnx.ModelProto, data: str | os.PathLike | None, data_key: str | None,
                  input_shapes: Sequence[str], count: int, seed: int
                  ) -> list[dict[str, np.ndarray]]:
    """`count` samples (batch 1 each): the first ones of `data` (anything
    `graphfix calibrate --data` reads), else seeded random inputs, sample i with seed+i,
    dynamic dims from `input_shapes` (NAME:DIMS) or the usual defaults."""
    if data is not None:
        from graphfix.runtime.data import open_data

        source = open_data(data, model, data_key=data_key, max_samples=count, batch_size=1)
        return list(islice(iter(source), count))
    inputs = graph_inputs(model)
    shapes = resolve_shapes(inputs, dict(parse_input_shape(s) for s in input_shapes))
    return [random_feeds(inputs, shapes, seed + i) for i in range(count)]


def tolerance_override(atol: float | None, rtol: float | None) -> Tolerance | None:
    """--atol/--rtol for float tensors; the dtype's default fills the one not given."""
    if atol is None and rtol is None:
        return None
    default = tolerance_for("float32")
    return Tolerance(rtol if rtol is not None else default.rtol,
                     atol if atol is not None else default.atol)
