"""Running a model in onnxruntime the way graphfix defines "the reference".

CPU execution provider (unless asked otherwise), every onnxruntime graph
optimization disabled (so onnxruntime's own rewrites cannot hide or cause a
difference), one intra-op thread order fixed by onnxruntime itself.

Threads. Each onnxruntime session owns a thread pool (by default one thread per
physical core, each sleeping or spinning between runs) for as long as it lives; a
command that makes many sessions (a check per pass, a session per folded subgraph)
must not let them pile up (issue 15: ~950 threads on 2 cores). Every session graphfix
makes computes with `intra_op_threads()` threads (the CPUs this process may use) and
one inter-op thread, and lives only as long as its run. No library makes sessions in
graphfix's process: constant folding is graphfix's own (`passes._fold_closure`).

Inputs of dtypes numpy lacks (bfloat16, float8, int4/uint4, int2/uint2, float4e2m1,
float8e8m0) are kept as ml_dtypes arrays (one element per item, as onnx's
`numpy_helper` gives them); `ort_feeds` hands them to onnxruntime as OrtValues of the
ONNX type (sub-byte types packed, first element in the low bits), which is the only
form onnxruntime takes them in.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from graphfix import weights
from graphfix.errors import GraphfixError
from graphfix.runtime.work import check_work

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
    items = providers.split(",") if isinstance(providers, str) else providers
    names = tuple(PROVIDERS.get(p.strip().lower(), p.strip()) for p in items if p.strip())
    if not names:
        raise GraphfixError("no onnxruntime execution provider given",
                            "the --providers list names none", "pass --providers cpu, or cuda,cpu")
    if set(names) == {PROVIDERS["cpu"]}:  # every onnxruntime has it; no import (20 ms) to ask
        return names
    import onnxruntime as ort

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


def session_options(basic: bool = False, fast: bool = False, once: bool = False):
    """graphfix's session options; `basic` turns on onnxruntime's BASIC graph
    optimizations (constant folding, Conv+BatchNorm/Add/Mul fusion), which only the
    noise-floor measurement uses (`runtime.outputs`); `fast` turns on all of them
    (layout changes, kernel fusions), for calibration statistics, where the values
    matter up to float rounding and the time is most of the command's. `once`: the
    session runs one batch (the per-pass check), so weights are not pre-packed."""
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
    so.intra_op_num_threads = intra_op_threads()
    so.inter_op_num_threads = 1
    if once:
        # Pre-packing lays MatMul/Conv weights out for the kernels when the session is
        # made, to save that work on every later run; a session that runs once pays it
        # and saves nothing (vit_b_32: 0.37 s -> 0.13 s per session, the run 0.05 s ->
        # 0.07 s, and a copy of the weights less). Conv outputs can differ from a
        # pre-packed session's in the last bits (another accumulation order); the check
        # runs the original and every candidate this same way, like with like.
        so.add_session_config_entry("session.disable_prepacking", "1")
    return so


def intra_op_threads() -> int:
    """The threads one graphfix session computes with: the CPUs this process may run on
    (its CPU affinity, lowered to a cgroup v2 CPU quota where one is set), at least 1.
    onnxruntime's own default counts the machine's cores, ignoring both."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(quota) // int(period)))
    except (OSError, ValueError):  # no cgroup v2, or no quota
        pass
    return max(1, cpus)


_QUIET = False


def quiet_onnxruntime() -> None:
    """From now on onnxruntime prints none of its process-wide log lines (those of no
    session, e.g. a provider library that failed to load; each session graphfix makes
    is quiet by its options): at once when onnxruntime is imported, else when graphfix
    first makes a session, so a command that needs no session does not import it (20 ms)."""
    global _QUIET
    _QUIET = True
    if "onnxruntime" in sys.modules:
        sys.modules["onnxruntime"].set_default_logger_severity(4)


def make_session(model: onnx.ModelProto, providers: Sequence[str] = ("cpu",),
                 basic: bool = False, fast: bool = False, once: bool = False,
                 extra_outputs: Sequence[str] = ()):
    """An onnxruntime InferenceSession for an in-memory model; `extra_outputs` (tensors
    of the main graph) are graph outputs of the session's model too, `model` unchanged.

    Models over the 2 GB protobuf limit are written to a temporary directory with
    external data first. Raises GraphfixError for a provider onnxruntime lacks or could
    not start (`provider_names`), `runtime.work.TooMuchWork` (a GraphfixError) for a
    model with a Loop that would not finish, else whatever onnxruntime raises; callers
    decide whether that is the user's problem or a broken rewrite. The session's `run`
    takes feeds of every dtype `ort_feeds` does.
    """
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_inference_collection import InferenceSession

    if _QUIET:
        ort.set_default_logger_severity(4)
    check_work(model)  # a Loop that would never finish is refused before onnxruntime runs it
    session_class = _session_class(InferenceSession)
    names = provider_names(providers)
    if weights.deferred(model):  # weights left in their file (io.load(weights=False))
        options = session_options(basic, fast, once)
        data, values = weights.session_bytes(model, options)  # memory maps of the files
        if data is not None:
            data += _outputs_suffix(model, extra_outputs)
            session = _started(session_class(data, sess_options=options, providers=names),
                               names)
            session.graphfix_weights = values  # onnxruntime reads them while it lives
            return session
        model = weights.materialized(model)  # over 2 GB even so: a full copy (rare)
    try:  # ByteSize() would serialize too (upb): serialize once, fall back past 2 GB
        data = model.SerializeToString()
    except Exception:  # protobuf raises ValueError or EncodeError past the 2 GB limit
        data = None
    options = session_options(basic, fast, once)
    if data is not None:
        data += _outputs_suffix(model, extra_outputs)
        return _started(session_class(data, sess_options=options, providers=names), names)
    with tempfile.TemporaryDirectory(prefix="graphfix-ort-") as tmp:
        path = os.path.join(tmp, "model.onnx")
        big = onnx.ModelProto()
        big.CopyFrom(model)
        big.MergeFromString(_outputs_suffix(model, extra_outputs))
        onnx.save_model(big, path, save_as_external_data=True, location="model.onnx.data")
        return _started(session_class(path, sess_options=options, providers=names), names)


def run_model(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    providers: Sequence[str] = ("cpu",),
    basic: bool = False,
    extra_outputs: Sequence[str] = (),
    run_options=None,
) -> dict[str, np.ndarray]:
    """Run the model once; returns every graph output by name, and `extra_outputs`.
    `run_options`: onnxruntime's RunOptions for the run (its `terminate` stops it)."""
    sess = make_session(model, providers, basic, once=True, extra_outputs=extra_outputs)
    names = [o.name for o in sess.get_outputs()]
    values = sess.run(names, dict(feeds), run_options)
    return {name: _owned(value) for name, value in zip(names, values, strict=True)}


def _owned(value):
    """A run's output holding its own memory. onnxruntime returns arrays over its
    tensors, in the session's memory arena, and the whole arena lives as long as one of
    them does, after the session is gone: the check keeps the original's outputs for the
    whole run, and they kept every chunk the run allocated. Mask R-CNN: the original's
    run holds 534 MiB, 364 MiB after its session is deleted with its outputs kept, 144
    MiB with their copies kept (84 x 1 x 320 x 320 masks)."""
    if isinstance(value, np.ndarray):
        return value if value.base is None else np.array(value)
    if isinstance(value, list):  # a sequence output
        return [_owned(v) for v in value]
    return value


def _outputs_suffix(model: onnx.ModelProto, names: Sequence[str]) -> bytes:
    """A serialized ModelProto whose graph has only `names` (those not graph outputs
    already) as outputs: appended to a serialized model, protobuf's parser merges it in,
    so the model gets those outputs without a copy of its weights."""
    names = [n for n in dict.fromkeys(names) if n not in {o.name for o in model.graph.output}]
    if not names:
        return b""
    extra = onnx.ModelProto()
    extra.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    return extra.SerializeToString()


@functools.cache
def _session_class(base: type) -> type:
    """`base` (onnxruntime's InferenceSession) with `run` taking ml_dtypes feeds."""
    class GraphfixSession(base):  # type: ignore[misc, valid-type]
        def run(self, output_names, input_feed, run_options=None):
            return super().run(output_names, ort_feeds(input_feed), run_options)

    return GraphfixSession


def ort_feeds(feeds: Mapping[str, object]) -> dict[str, object]:
    """`feeds` as onnxruntime takes them: numpy arrays of numpy's own dtypes (strings as
    object arrays) as they are, ml_dtypes arrays as OrtValues (module docstring)."""
    return {k: _ort_value(v) if isinstance(v, np.ndarray) and is_extension_dtype(v.dtype)
            else v for k, v in feeds.items()}


def is_extension_dtype(dtype: np.dtype) -> bool:
    """Whether `dtype` is not numpy's own but registered by an extension (ml_dtypes:
    numpy numbers those from NPY_USERDEF, 256, up). Their `kind` says little: 'V' for
    most, 'f' for float8_e5m2."""
    return dtype.num >= 256


def _ort_value(arr: np.ndarray):
    import onnxruntime as ort

    elem = helper.np_dtype_to_tensor_dtype(arr.dtype)
    value = ort.OrtValue.ortvalue_from_shape_and_type(list(arr.shape), elem)
    raw = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
    bits = weights.PACKED_BITS.get(elem)
    if bits:  # onnxruntime stores 8 // bits elements per byte, the first in the low bits
        per = 8 // bits
        raw = np.concatenate([raw & ((1 << bits) - 1),
                              np.zeros(-raw.size % per, np.uint8)]).reshape(-1, per)
        raw = np.bitwise_or.reduce(raw << (np.arange(per, dtype=np.uint8) * bits), axis=1)
        raw = raw.astype(np.uint8)
    size = value.tensor_size_in_bytes()
    if raw.nbytes != size:
        raise ValueError(f"{arr.dtype} data of shape {arr.shape} is {raw.nbytes} bytes, "
                         f"onnxruntime's tensor {size}")
    if size:
        ctypes.memmove(value.data_ptr(), raw.ctypes.data, size)
    return value
