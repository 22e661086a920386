"""The TensorRT side of `graphfix check --trt`: an engine, and the tensors it can show.

    engine = open_engine(EngineSpec(Path("model.onnx")), wanted=ref_tensor_names,
                         samples=feeds)
    engine.exposed        # the tensors a run returns: outputs + debug tensors
    engine.infer(feeds)   # {name: array} for one sample
    engine.close()

Built on polygraphy's TensorRT loaders and runner (`polygraphy.backend.trt`).

**NOT VERIFIED AGAINST A REAL TENSORRT.** No TensorRT and no GPU exist where graphfix
is developed; the tests drive this module with stand-ins for polygraphy's loaders and
for `tensorrt` (tests/check/test_layerwise_trt.py). The API calls follow polygraphy 0.49-0.53
and TensorRT's headers (`include/NvInfer.h`, `NvInferRuntime.h` at NVIDIA/TensorRT
v11.1). What is not known is how a real engine behaves. First runs on real hardware
should check three things: which tensors the inspector lists, that the rebuilt engine
keeps the first build's layers (a note says when it does not), and the tolerances.

How tensors are exposed without changing the engine. Marking every tensor as a network
output (polygraphy's `--trt-outputs mark all`) breaks fusions and changes the results
(NVIDIA/TensorRT#3258, #3592). Instead, for an ONNX candidate:

1. Build the engine as a user would: polygraphy's `NetworkFromOnnxPath`, `CreateConfig`
   and `EngineFromNetwork`, with TF32 off and detailed profiling verbosity.
2. Read which tensors survived as tensors of the engine: the inputs and outputs of its
   layers, from `IEngineInspector`'s JSON (`{"Layers": [{"Inputs": [{"Name": ..}], ...}]}`).
   A tensor that was fused away is not there.
3. Rebuild with exactly the survivors that the reference also has marked as debug
   tensors (polygraphy's `MarkDebug`, i.e. `INetworkDefinition.markDebug`). markDebug
   keeps a tensor from being fused; these tensors were not fused in step 1, so the
   fusions should stay the same. The two builds' layer lists are compared, and a note
   says when they differ.
4. Run with polygraphy's `TrtRunner`. It turns every debug tensor on
   (`set_all_tensors_debug_state`) and returns their values with the outputs.

markUnfusedTensorsAsDebugTensors (TensorRT 10.x+) is not used. NvInfer.h warns that
"DebugListener can only get internal tensor names instead of the original tensor
names" for tensors marked that way, and that "there is no guarantee that all unfused
tensors are marked". graphfix matches tensors by their ONNX names.

A serialized engine (`.engine`, `.plan`, `.trt`) is used as it was built. The tensors
compared are its outputs, plus those of the reference's tensors the engine reports as
debug tensors (`ICudaEngine.is_debug_tensor`; e.g. built with `trtexec --markDebug`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphfix.check.status import TensorStatus
from graphfix.errors import GraphfixError, said

ENGINE_SUFFIXES = (".engine", ".plan", ".trt")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
FUSED, NOT_DEBUG, NOT_MARKED = TensorStatus.FUSED, TensorStatus.NOT_DEBUG, TensorStatus.NOT_MARKED


@dataclass(frozen=True)
class EngineSpec:
    """What the candidate engine is: a serialized engine, or an ONNX model to build.

    `precision` applies to builds: "fp32" (TF32 off), or "fp16"/"bf16"/"int8" to let
    TensorRT pick those kernels (weakly typed TensorRT <= 10.x only; TensorRT 11 takes
    the precision from the model's types). A Q/DQ model also gets the INT8 flag
    where that flag exists. `workspace` caps TensorRT's workspace pool (bytes)."""

    path: Path
    precision: str = "fp32"
    workspace: int | None = None

    @property
    def is_engine_file(self) -> bool:
        return is_engine_path(self.path)


def is_engine_path(path: Path) -> bool:
    """A serialized TensorRT engine, by its suffix (trtexec --saveEngine writes any name;
    .engine, .plan and .trt are the usual ones)."""
    return path.suffix.lower() in ENGINE_SUFFIXES


@dataclass
class TrtEngine:
    """A running engine: `infer` returns the outputs and debug tensors of one sample.
    `absent` is the status of a tensor it was asked for (`asked`; empty: every
    tensor) and does not expose."""

    runner: Any
    exposed: frozenset[str]
    absent: TensorStatus
    notes: list[str] = field(default_factory=list)
    asked: frozenset[str] = frozenset()
    sqnr_by_default: bool = False  # precision unknown or reduced: judge by SQNR
    input_dtypes: dict[str, np.dtype] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.input_dtypes:
            self.input_dtypes = _input_dtypes(self.runner)

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The exposed tensors for one sample; inputs are cast to the engine's types
        when only the width differs (TensorRT 8.x takes INT64 inputs as INT32)."""
        given = {k: _as_engine_type(v, self.input_dtypes.get(k)) for k, v in feeds.items()}
        try:
            out = self.runner.infer(given)
        except Exception as err:  # polygraphy raises PolygraphyException; TensorRT, RuntimeError
            raise _engine_error("run", err) from None
        # TrtRunner may reuse its output buffers between runs: copy what is kept
        return {k: np.array(v, copy=True) for k, v in out.items() if k in self.exposed}

    def status(self, name: str) -> TensorStatus:
        """Why tensor `name` is not compared, when the engine does not expose it."""
        return self.absent if not self.asked or name in self.asked else NOT_MARKED

    def close(self) -> None:
        try:
            self.runner.deactivate()
        except Exception:  # best effort: a runner that failed to activate has nothing to free
            pass


def _input_dtypes(runner: Any) -> dict[str, np.dtype]:
    from polygraphy.datatype import DataType

    out = {}
    try:
        for name, meta in runner.get_input_metadata().items():
            out[name] = np.dtype(DataType.to_dtype(meta.dtype, "numpy"))
    except Exception:  # metadata is a convenience: without it inputs go as given
        return {}
    return out


def _as_engine_type(value: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    value = np.asarray(value)
    if dtype is None or value.dtype == dtype or value.dtype.kind != dtype.kind:
        return value
    if dtype.kind in "iu" and value.size:
        info = np.iinfo(dtype)
        if value.min() < info.min or value.max() > info.max:
            raise GraphfixError(
                f"An input holds values the engine's {dtype} input cannot",
                f"values from {value.min()} to {value.max()}",
                "give inputs within that range",
            )
    return value.astype(dtype)


def open_engine(spec: EngineSpec, wanted: Sequence[str],
                samples: Sequence[Mapping[str, np.ndarray]],
                has_qdq: bool = False) -> TrtEngine:
    """Build or load the engine, and activate a TrtRunner on it (module docstring).
    `wanted` are the reference's tensor names; `samples` fix the optimization profile
    (min/max of each input's shape over the samples). GraphfixError when tensorrt is
    not installed, the file is not there, or TensorRT cannot build or load it."""
    from graphfix.trt.matrix import import_tensorrt  # lazy: most checks need no TensorRT

    if not spec.path.is_file():
        raise GraphfixError(f"{spec.path} does not exist", "the candidate must be a file",
                            "give an ONNX model or a serialized TensorRT engine")
    trt = import_tensorrt("compare against a TensorRT engine")
    from polygraphy.backend import trt as ptrt  # after tensorrt: polygraphy imports it lazily

    if spec.is_engine_file:
        from polygraphy.backend.common import BytesFromPath

        engine = _call("load the engine", ptrt.EngineFromBytes(BytesFromPath(str(spec.path))))
        exposed, notes = _file_exposed(engine, wanted)
        runner = _activate(ptrt.TrtRunner(engine))
        return TrtEngine(runner, exposed, NOT_DEBUG, notes, frozenset(wanted),
                         sqnr_by_default=True)
    if spec.precision not in PRECISIONS:
        raise GraphfixError(f"Unknown TensorRT precision '{spec.precision}'",
                            f"the precisions are {', '.join(PRECISIONS)}",
                            "use fp32 to check the engine's arithmetic, fp16/bf16/int8 for "
                            "reduced precision")
    config = ptrt.CreateConfig(**config_options(trt, spec, has_qdq, samples))
    first = _call("build the engine", ptrt.EngineFromNetwork(
        ptrt.NetworkFromOnnxPath(str(spec.path)), config=config))
    survivors = layer_tensors(_engine_json(trt, first))
    io = set(_io_names(first))
    inner = [n for n in dict.fromkeys(wanted) if n not in io]
    mark = [n for n in inner if n in survivors]
    notes = [f"{len(mark)} of the {len(inner)} intermediate tensors survived TensorRT's "
             "fusions and were marked as debug tensors (a second build); the other "
             f"{len(inner) - len(mark)} were fused"]
    engine = first
    if mark:
        engine = _call("build the engine with debug tensors", ptrt.EngineFromNetwork(
            ptrt.MarkDebug(ptrt.NetworkFromOnnxPath(str(spec.path)), mark), config=config))
        before = layer_names(_engine_json(trt, first))
        after = layer_names(_engine_json(trt, engine))
        if before != after:
            notes.append(f"marking the debug tensors changed the engine's layers ({len(before)} "
                         f"layers before, {len(after)} after): the engine compared is not "
                         "exactly the one built without them")
    runner = _activate(ptrt.TrtRunner(engine))
    return TrtEngine(runner, frozenset(io | set(mark)), FUSED, notes, frozenset(wanted),
                     sqnr_by_default=spec.precision != "fp32")


def config_options(trt: Any, spec: EngineSpec, has_qdq: bool,
                   samples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, Any]:
    """CreateConfig's keyword arguments for `spec` (module docstring, step 1)."""
    weakly_typed = hasattr(getattr(trt, "BuilderFlag", None), "FP16")
    options: dict[str, Any] = {"tf32": False, "profiling_verbosity":
                               trt.ProfilingVerbosity.DETAILED}
    if spec.precision != "fp32":
        if not weakly_typed:
            raise GraphfixError(
                f"TensorRT {trt.__version__} has no {spec.precision} builder flag",
                "TensorRT 11 is strongly typed: each layer runs in its tensors' types "
                "(../shared/trt/calibration_notes.md, section d)",
                "convert the model itself (e.g. to fp16, or Q/DQ with graphfix "
                "calibrate) and check it with --trt-precision fp32",
            )
        options[spec.precision] = True
    if has_qdq and weakly_typed:
        options["int8"] = True
    profile = input_profile(samples)
    if profile:
        prof = _profile_cls()()
        for name, (low, high) in profile.items():
            prof.add(name, min=low, opt=high, max=high)
        options["profiles"] = [prof]
    if spec.workspace:
        options["memory_pool_limits"] = {trt.MemoryPoolType.WORKSPACE: int(spec.workspace)}
    return options


def _profile_cls():
    from polygraphy.backend.trt import Profile

    return Profile


def input_profile(samples: Sequence[Mapping[str, np.ndarray]]
                  ) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Per input, the smallest and largest shape (per dim) the samples use."""
    out: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for sample in samples:
        for name, value in sample.items():
            shape = tuple(int(d) for d in np.shape(value))
            if name not in out:
                out[name] = (shape, shape)
                continue
            low, high = out[name]
            if len(low) != len(shape):
                raise GraphfixError(
                    f"The samples give input '{name}' different ranks",
                    f"shapes {low} and {shape}",
                    "give every sample the same rank for each input",
                )
            out[name] = (tuple(map(min, low, shape)), tuple(map(max, high, shape)))
    return out


def layer_tensors(info: Mapping[str, Any]) -> set[str]:
    """Every tensor name an engine's layers read or write (IEngineInspector JSON)."""
    names: set[str] = set()
    for layer in _layers(info):
        for key in ("Inputs", "Outputs"):
            for desc in layer.get(key) or ():
                if isinstance(desc, dict) and desc.get("Name"):
                    names.add(str(desc["Name"]))
    return names


def layer_names(info: Mapping[str, Any]) -> list[str]:
    return [str(layer.get("Name", "")) for layer in _layers(info)]


def _layers(info: Mapping[str, Any]) -> list[dict]:
    layers = info.get("Layers") if isinstance(info, Mapping) else None
    if not isinstance(layers, list) or (layers and not isinstance(layers[0], dict)):
        raise GraphfixError(
            "TensorRT's engine inspector gave no layer details",
            "the engine was built without detailed profiling verbosity",
            "report this: graphfix builds with ProfilingVerbosity.DETAILED",
        )
    return [layer for layer in layers if isinstance(layer, dict)]


def _engine_json(trt: Any, engine: Any) -> dict:
    inspector = engine.create_engine_inspector()
    text = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
    try:
        return json.loads(text)
    except (TypeError, ValueError) as err:
        raise GraphfixError("TensorRT's engine inspector gave unreadable JSON", str(err),
                            "report this with your TensorRT version") from None


def _io_names(engine: Any) -> list[str]:
    return [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]


def _file_exposed(engine: Any, wanted: Sequence[str]) -> tuple[frozenset[str], list[str]]:
    io = set(_io_names(engine))
    check = getattr(engine, "is_debug_tensor", None)
    debug = {n for n in wanted if n not in io and check is not None and _safe(check, n)}
    notes = []
    if not debug:
        notes.append("the engine has no debug tensors that the reference also has: only its "
                     "outputs were compared; let graphfix build it (graphfix check REF "
                     "model.onnx --trt) to compare the tensors TensorRT keeps")
    return frozenset(io | debug), notes


def _safe(check: Callable[[str], bool], name: str) -> bool:
    try:
        return bool(check(name))
    except Exception:  # TensorRT raises for names it does not know
        return False


def _call(what: str, loader: Callable[[], Any]) -> Any:
    try:
        result = loader()
    except GraphfixError:
        raise
    except Exception as err:  # polygraphy raises PolygraphyException; TensorRT, RuntimeError
        raise _engine_error(what, err) from None
    if result is None:
        raise _engine_error(what, RuntimeError("TensorRT returned nothing"))
    return result


def _activate(runner: Any) -> Any:
    try:
        runner.activate()
    except Exception as err:
        raise _engine_error("start the engine", err) from None
    return runner


def _engine_error(what: str, err: Exception) -> GraphfixError:
    return GraphfixError(
        f"TensorRT could not {what}", f"it says: {said(err, last=True)}",
        "run `graphfix doctor` on the model for what TensorRT rejects; a serialized engine "
        "must come from the TensorRT version installed here",
    )
