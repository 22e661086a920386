"""Stand-ins for `tensorrt` and polygraphy's TensorRT loaders, for check.engine's tests.

There is no TensorRT where graphfix is developed: these fakes pin down what graphfix
asks of polygraphy and TensorRT (which loaders, in which order, with which options)
and give the rest of `graphfix check --trt` an engine to compare against. They do not
show that a real engine behaves this way.

The "engine" is the ONNX model run in onnxruntime. Its layers follow the ONNX nodes,
except that a Relu right after a Conv is fused into it, as TensorRT does: the Conv's
output is then not a tensor of the engine. A serialized "engine" is a JSON file
{"onnx": path, "debug": [names]}.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field

import onnx
from onnx import helper

from graphfix.runtime.session import make_session


@dataclass
class Log:
    configs: list[dict] = field(default_factory=list)
    builds: list[tuple[str, ...]] = field(default_factory=list)  # debug names per build
    runners: list = field(default_factory=list)
    layers_change: bool = False  # the rebuild with debug tensors gets other layers


def fake_tensorrt(version: str = "10.8.0", weakly_typed: bool = True) -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    flags = {"TF32": 0, "DEBUG": 2} | ({"FP16": 3, "INT8": 4, "BF16": 5} if weakly_typed else {})
    trt.BuilderFlag = types.SimpleNamespace(**flags)
    trt.ProfilingVerbosity = types.SimpleNamespace(DETAILED="detailed", LAYER_NAMES_ONLY="names")
    trt.LayerInformationFormat = types.SimpleNamespace(JSON="json", ONELINE="oneline")
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="workspace")
    return trt


def layers(model: onnx.ModelProto, log: Log, marked: tuple[str, ...]) -> list[dict]:
    """The fake engine's layers: one per node, Conv + Relu fused unless the Conv's
    output is marked as a debug tensor (markDebug keeps a tensor from being fused)."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    out, skip = [], set()
    for node in model.graph.node:
        if node.name in skip:
            continue
        users = consumers.get(node.output[0], [])
        if (node.op_type == "Conv" and len(users) == 1 and users[0].op_type == "Relu"
                and node.output[0] not in marked):
            relu = users[0]
            skip.add(relu.name)
            out.append({"Name": f"{node.name} + {relu.name}", "LayerType": "CaskConvolution",
                        "Inputs": [{"Name": node.input[0]}],
                        "Outputs": [{"Name": relu.output[0]}]})
            continue
        out.append({"Name": node.name, "LayerType": node.op_type,
                    "Inputs": [{"Name": i} for i in node.input[:1] if i],
                    "Outputs": [{"Name": o} for o in node.output if o]})
    if log.layers_change and marked:
        out.append({"Name": "Reformatting CopyNode", "LayerType": "Reformat",
                    "Inputs": [], "Outputs": []})
    return out


class FakeEngine:
    def __init__(self, path: str, marked: tuple[str, ...], log: Log) -> None:
        self.path, self.marked, self.log = path, marked, log
        self.model = onnx.load(path)
        inits = {t.name for t in self.model.graph.initializer}
        self.io = [vi.name for vi in self.model.graph.input if vi.name not in inits]
        self.io += [vi.name for vi in self.model.graph.output]

    @property
    def num_io_tensors(self) -> int:
        return len(self.io)

    def get_tensor_name(self, index: int) -> str:
        return self.io[index]

    def is_debug_tensor(self, name: str) -> bool:
        return name in self.marked

    def create_engine_inspector(self):
        info = {"Layers": layers(self.model, self.log, self.marked), "Bindings": self.io}
        return types.SimpleNamespace(get_engine_information=lambda fmt: json.dumps(info))


class FakeRunner:
    """polygraphy's TrtRunner: outputs and every debug tensor, per run."""

    def __init__(self, engine: FakeEngine, log: Log) -> None:
        self.engine, self.is_active, self.runs = engine, False, 0
        log.runners.append(self)

    def activate(self) -> None:
        model = onnx.ModelProto()
        model.CopyFrom(self.engine.model)
        names = [vi.name for vi in model.graph.output] + list(self.engine.marked)
        del model.graph.output[:]
        model.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
        self.names = names
        self.session = make_session(model)
        self.is_active = True

    def get_input_metadata(self):
        raise RuntimeError("not in the fake")  # graphfix then sends inputs as they are

    def infer(self, feeds):
        assert self.is_active, "infer before activate"
        self.runs += 1
        return dict(zip(self.names, self.session.run(self.names, dict(feeds)), strict=True))

    def deactivate(self) -> None:
        self.is_active = False


def install(monkeypatch, version: str = "10.8.0", weakly_typed: bool = True) -> Log:
    """Put the fakes in place of `tensorrt` and polygraphy.backend.trt's loaders."""
    import polygraphy.backend.common as pcommon
    import polygraphy.backend.trt as ptrt

    log = Log()
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(version, weakly_typed))

    class NetworkFromOnnxPath:
        def __init__(self, path):
            self.path, self.marked = path, ()

    class MarkDebug:
        def __init__(self, network, mark_debug):
            self.path, self.marked = network.path, tuple(mark_debug)

    def create_config(**options):
        log.configs.append(options)
        return options

    class EngineFromNetwork:
        def __init__(self, network, config=None):
            self.network, self.config = network, config

        def __call__(self):
            log.builds.append(self.network.marked)
            return FakeEngine(self.network.path, self.network.marked, log)

    class BytesFromPath:
        def __init__(self, path):
            self.path = path

    class EngineFromBytes:
        def __init__(self, loader):
            self.loader = loader

        def __call__(self):
            with open(self.loader.path) as f:
                spec = json.load(f)
            return FakeEngine(spec["onnx"], tuple(spec["debug"]), log)

    for name, value in {
        "NetworkFromOnnxPath": NetworkFromOnnxPath, "MarkDebug": MarkDebug,
        "CreateConfig": create_config, "EngineFromNetwork": EngineFromNetwork,
        "EngineFromBytes": EngineFromBytes,
        "TrtRunner": lambda engine: FakeRunner(engine, log),
    }.items():
        monkeypatch.setattr(ptrt, name, value)
    monkeypatch.setattr(pcommon, "BytesFromPath", BytesFromPath)
    return log
