"""Running a model in onnxruntime the way graphfix defines "the reference".

CPU execution provider (unless asked otherwise), every onnxruntime graph
optimization disabled (so onnxruntime's own rewrites cannot hide or cause a
difference), one intra-op thread order fixed by onnxruntime itself.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def session_options(basic: bool = False, fast: bool = False):
    """graphfix's session options; `basic` turns on onnxruntime's BASIC graph
    optimizations (constant folding, Conv+BatchNorm/Add/Mul fusion), which only the
    noise-floor measurement uses (`runtime.outputs`); `fast` turns on all of them
    (layout changes, kernel fusions), for calibration statistics, where the values
    matter up to float rounding and the time is most of the command's."""
    import onnxruntime as ort

    levels = ort.GraphOptimizationLevel
    so = ort.SessionOptions()
    so.graph_optimization_level = (levels.ORT_ENABLE_ALL if fast else
                                   levels.ORT_ENABLE_BASIC if basic else levels.ORT_DISABLE_ALL)
    so.log_severity_level = 4  # errors are raised to graphfix, which says them
    # onnxruntime's memory-reuse planner takes seconds per session on graphs with
    # many small dynamic-shape tensors (1.6-2.0 s -> 0.2 s on SSDlite, bench/RESULTS.md);
    # results are identical, peak memory was the same there. The cost: activations
    # are not shared, so a model with huge activations needs more memory to check.
    so.enable_mem_reuse = False
    # graphfix interleaves runs with numpy work on the outputs (comparisons, histograms);
    # onnxruntime's idle worker threads spin-wait after each run by default and took the
    # cores that work needed (measured: a 16K-element comparison 0.15 ms alone, 20 ms
    # between runs on 2 cores). Threads now sleep between runs.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return so


def make_session(model: onnx.ModelProto, providers: Sequence[str] = ("cpu",),
                 basic: bool = False, fast: bool = False):
    """An onnxruntime InferenceSession for an in-memory model.

    Models over the 2 GB protobuf limit are written to a temporary directory with
    external data first. Raises whatever onnxruntime raises; callers decide
    whether that is the user's problem or a broken rewrite.
    """
    import onnxruntime as ort

    names = [PROVIDERS.get(p.strip().lower(), p) for p in providers]
    try:  # ByteSize() would serialize too (upb): serialize once, fall back past 2 GB
        data = model.SerializeToString()
    except Exception:  # protobuf raises ValueError or EncodeError past the 2 GB limit
        data = None
    options = session_options(basic, fast)
    if data is not None:
        return ort.InferenceSession(data, sess_options=options, providers=names)
    with tempfile.TemporaryDirectory(prefix="graphfix-ort-") as tmp:
        path = os.path.join(tmp, "model.onnx")
        big = onnx.ModelProto()
        big.CopyFrom(model)
        onnx.save_model(big, path, save_as_external_data=True, location="model.onnx.data")
        return ort.InferenceSession(path, sess_options=options, providers=names)


def run_model(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    providers: Sequence[str] = ("cpu",),
    basic: bool = False,
) -> dict[str, np.ndarray]:
    """Run the model once; returns every graph output by name."""
    sess = make_session(model, providers, basic)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feeds)), strict=True))
