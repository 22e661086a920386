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

from graphfix.errors import GraphfixError

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
_CUDA_HINT = ("install onnxruntime-gpu in place of onnxruntime (pip uninstall -y onnxruntime "
              "&& pip install onnxruntime-gpu; its CUDA major version must match the "
              "installed CUDA and cuDNN), or run on the CPU with --providers cpu")


def provider_names(providers: str | Sequence[str]) -> tuple[str, ...]:
    """onnxruntime's names for execution providers as graphfix spells them ("cuda,cpu",
    or a sequence; `cpu` and `cuda` are short for CPUExecutionProvider and
    CUDAExecutionProvider, full names pass through), checked against what the installed
    onnxruntime offers. Raises GraphfixError for none given or one it lacks, so asking
    for CUDA never runs on the CPU unnoticed."""
    import onnxruntime as ort

    items = providers.split(",") if isinstance(providers, str) else providers
    names = tuple(PROVIDERS.get(p.strip().lower(), p.strip()) for p in items if p.strip())
    if not names:
        raise GraphfixError("no onnxruntime execution provider given",
                            "the --providers list names none", "pass --providers cpu, or cuda,cpu")
    available = ort.get_available_providers()
    for name in names:
        if name not in available:
            known = name in PROVIDERS.values()
            raise GraphfixError(
                f"onnxruntime execution provider '{name}' is not available",
                f"the installed onnxruntime {ort.__version__} offers "
                f"{', '.join(available)}" + ("" if known else
                                             "; graphfix spells cpu and cuda short, other "
                                             "providers by onnxruntime's full name"),
                _CUDA_HINT if name == PROVIDERS["cuda"] else
                "pass providers from that list, e.g. --providers cpu")
    return names


def _started(sess, names: Sequence[str]):
    """`sess`, after checking onnxruntime started every provider asked for: an installed
    provider whose libraries fail to load is dropped with only a log line (which
    graphfix's log level hides), and the model would run on the CPU unnoticed."""
    dropped = [n for n in names if n not in sess.get_providers()]
    if dropped:
        raise GraphfixError(
            f"onnxruntime could not start the execution provider '{dropped[0]}'",
            "it is installed but failed to initialise (for CUDA: the CUDA runtime, cuBLAS "
            "or cuDNN libraries of the version onnxruntime was built for were not found, "
            f"or no GPU is visible); onnxruntime would run on {', '.join(sess.get_providers())}",
            "check the GPU setup with python -c \"import onnxruntime as o; o.preload_dlls(); "
            "print(o.get_device())\" (onnxruntime-gpu 1.21 and later), or run on the CPU "
            "with --providers cpu")
    return sess


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
    external data first. Raises GraphfixError for a provider onnxruntime lacks or could
    not start (`provider_names`), else whatever onnxruntime raises; callers decide
    whether that is the user's problem or a broken rewrite.
    """
    import onnxruntime as ort

    names = provider_names(providers)
    try:  # ByteSize() would serialize too (upb): serialize once, fall back past 2 GB
        data = model.SerializeToString()
    except Exception:  # protobuf raises ValueError or EncodeError past the 2 GB limit
        data = None
    options = session_options(basic, fast)
    if data is not None:
        return _started(ort.InferenceSession(data, sess_options=options, providers=names),
                        names)
    with tempfile.TemporaryDirectory(prefix="graphfix-ort-") as tmp:
        path = os.path.join(tmp, "model.onnx")
        big = onnx.ModelProto()
        big.CopyFrom(model)
        onnx.save_model(big, path, save_as_external_data=True, location="model.onnx.data")
        return _started(ort.InferenceSession(path, sess_options=options, providers=names),
                        names)


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
