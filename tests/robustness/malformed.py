"""Malformed inputs for the robustness table: each builder writes its files into a folder
and returns them. Models are built by hand (protobuf), never through onnx.helper's
checks, so they can be as broken as a real file in the wild."""

from __future__ import annotations

import io as _io
import json
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HUGE = 2**40


@dataclass
class Files:
    """What a case gives a command: the model, and optionally data or extra arguments."""

    model: Path
    data: Path | None = None
    args: dict[str, list[str]] = field(default_factory=dict)  # command -> extra arguments


Builder = Callable[[Path], Files]


def good_model(opset: int = 17) -> onnx.ModelProto:
    """x[1,4] -> MatMul(w[4,4]) -> Relu -> y[1,4]: the sound model the cases break."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 4])],
                              [helper.make_tensor_value_info("y", 1, [1, 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def good_data(folder: Path, rows: int = 4) -> Path:
    path = folder / "data.npz"
    np.savez(path, x=np.random.default_rng(0).standard_normal((rows, 4)).astype(np.float32))
    return path


def _write(folder: Path, model: onnx.ModelProto, name: str = "m.onnx") -> Path:
    path = folder / name
    path.write_bytes(model.SerializeToString())
    return path


def _case(edit: Callable[[onnx.ModelProto], object]) -> Builder:
    def build(folder: Path) -> Files:
        model = good_model()
        edit(model)
        return Files(_write(folder, model), good_data(folder))
    return build


def _bytes(content: bytes) -> Builder:
    def build(folder: Path) -> Files:
        path = folder / "m.onnx"
        path.write_bytes(content)
        return Files(path, good_data(folder))
    return build


def _truncated(folder: Path) -> Files:
    data = good_model().SerializeToString()
    return _bytes(data[: len(data) * 2 // 3])(folder)


def _tensor_file(folder: Path) -> Files:
    return _bytes(numpy_helper.from_array(np.ones(3, np.float32), "t").SerializeToString()
                  )(folder)


def _graph_file(folder: Path) -> Files:
    return _bytes(good_model().graph.SerializeToString())(folder)


def _cycle(model: onnx.ModelProto) -> None:
    nodes = model.graph.node
    nodes[0].input[0] = "y"  # mm reads relu's output, relu reads mm's


def _raw_short(model: onnx.ModelProto) -> None:
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:20]


def _raw_long(model: onnx.ModelProto) -> None:
    model.graph.initializer[0].raw_data += b"\0" * 16


def _init_huge(model: onnx.ModelProto) -> None:
    w = model.graph.initializer[0]
    del w.dims[:]
    w.dims.extend([4, HUGE])


def _input_huge(model: onnx.ModelProto) -> None:
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = HUGE


def _undefined_dtype(model: onnx.ModelProto) -> None:
    model.graph.initializer[0].data_type = TensorProto.UNDEFINED


def _opset(version: int) -> Callable[[onnx.ModelProto], None]:
    def edit(model: onnx.ModelProto) -> None:
        model.opset_import[0].version = version
    return edit


def _recursive_function(model: onnx.ModelProto) -> None:
    call = helper.make_node("Loopy", ["a"], ["b"], domain="local")
    fn = helper.make_function("local", "Loopy", ["a"], ["b"], [call],
                              [helper.make_opsetid("", 17)])
    model.functions.append(fn)
    model.opset_import.append(helper.make_opsetid("local", 1))
    model.graph.node[1].op_type, model.graph.node[1].domain = "Loopy", "local"


def _non_utf8(folder: Path) -> Files:
    data = good_model().SerializeToString().replace(b"relu", b"r\xffl\xfe")
    return _bytes(data)(folder)


def _undefined_tensor(model: onnx.ModelProto) -> None:
    model.graph.node[1].input[0] = "nowhere"


def _duplicate_outputs(model: onnx.ModelProto) -> None:
    model.graph.node.append(helper.make_node("Relu", ["h"], ["y"], name="relu2"))


def _negative_dim(model: onnx.ModelProto) -> None:
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = -4


def _negative_init_dim(model: onnx.ModelProto) -> None:
    w = model.graph.initializer[0]
    w.dims[0] = -4


def _unknown_domain(model: onnx.ModelProto) -> None:
    model.graph.node[1].domain = "com.example.nothere"
    model.opset_import.append(helper.make_opsetid("com.example.nothere", 1))


def _unknown_op(model: onnx.ModelProto) -> None:
    model.graph.node[1].op_type = "Frobnicate"


def _nested_ifs(depth: int) -> Builder:
    """If nodes nested `depth` deep in their then-branches: written byte by byte (onnx's
    helpers parse every attribute, and protobuf parses only about 30 such levels)."""
    def build(folder: Path) -> Files:
        def field(number: int, payload: bytes) -> bytes:
            return _varint(number << 3 | 2) + _varint(len(payload)) + payload

        other = helper.make_graph([helper.make_node("Neg", ["h"], ["e"])], "e", [],
                                  [helper.make_tensor_value_info("e", 1, [1, 4])])
        body = helper.make_graph([helper.make_node("Relu", ["h"], ["b0"])], "b0", [],
                                 [helper.make_tensor_value_info("b0", 1, [1, 4])]
                                 ).SerializeToString()
        for level in range(1, depth + 1):
            out = f"b{level}" if level < depth else "y"
            node = helper.make_node("If", ["c"], [out], else_branch=other).SerializeToString()
            then = field(1, b"then_branch") + field(6, body) + _varint(20 << 3) + _varint(5)
            node += field(5, then)
            if level == depth:
                body = node
                break
            body = helper.make_graph([], f"b{level}", [], [
                helper.make_tensor_value_info(out, 1, [1, 4])]).SerializeToString()
            body += field(1, node)
        model = good_model()
        del model.graph.node[1]
        model.graph.initializer.append(numpy_helper.from_array(np.array(True), "c"))
        graph = model.graph.SerializeToString() + field(1, body)
        model.ClearField("graph")
        path = folder / "m.onnx"
        path.write_bytes(model.SerializeToString() + field(7, graph))
        return Files(path, good_data(folder))
    return build


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _external(location: str, length: int | None = None, write: bool = True) -> Builder:
    def build(folder: Path) -> Files:
        model = good_model()
        w = model.graph.initializer[0]
        raw = w.raw_data
        w.ClearField("raw_data")
        w.data_location = TensorProto.EXTERNAL
        for key, val in (("location", location), ("offset", "0"),
                         ("length", str(length if length is not None else len(raw)))):
            entry = w.external_data.add()
            entry.key, entry.value = key, val
        if write and not location.startswith("/") and ".." not in location:
            (folder / location).write_bytes(raw[: length if length is not None else None])
        return Files(_write(folder, model), good_data(folder))
    return build


def _short_external(folder: Path) -> Files:
    files = _external("w.bin")(folder)
    (folder / "w.bin").write_bytes(b"\0" * 8)
    return files


def _loop(trips: int) -> Callable[[onnx.ModelProto], None]:
    def edit(model: onnx.ModelProto) -> None:
        model.graph.initializer.extend([
            numpy_helper.from_array(np.array(trips, np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "keep")])
        body = helper.make_graph(
            [helper.make_node("Identity", ["c_in"], ["c_out"]),
             helper.make_node("Add", ["v_in", "v_in"], ["v_out"])], "body",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []),
             helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
             helper.make_tensor_value_info("v_in", 1, [1, 4])],
            [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("v_out", 1, [1, 4])])
        model.graph.node[1].CopyFrom(helper.make_node("Loop", ["trips", "keep", "h"], ["y"],
                                                      body=body, name="loop"))
    return edit


# --- data files --------------------------------------------------------------------------

def _data(content: Callable[[Path], Path]) -> Builder:
    def build(folder: Path) -> Files:
        return Files(_write(folder, good_model()), content(folder))
    return build


def _npz(arrays: dict[str, np.ndarray]) -> Callable[[Path], Path]:
    def write(folder: Path) -> Path:
        path = folder / "data.npz"
        np.savez(path, **arrays)
        return path
    return write


def _pickled_npy(folder: Path) -> Path:
    path = folder / "data.npy"
    np.save(path, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    return path


def _pickled_npz(folder: Path) -> Path:
    path = folder / "data.npz"
    np.savez(path, x=np.array([{"x": 1}], dtype=object))
    return path


def _truncated_npz(folder: Path) -> Path:
    path = good_data(folder)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _huge_npy(folder: Path) -> Path:
    path = folder / "data.npy"
    header = {"descr": "<f4", "fortran_order": False, "shape": (HUGE, 1, 4)}
    buf = _io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    path.write_bytes(buf.getvalue() + b"\0" * 64)
    return path


def _not_an_array(folder: Path) -> Path:
    path = folder / "data.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", b"this is not an array")
    return path


def _pickle_file(folder: Path) -> Path:
    path = folder / "data.npy"
    path.write_bytes(pickle.dumps({"x": np.zeros((1, 4))}))
    return path


def _json_model(folder: Path) -> Files:
    return _bytes(json.dumps({"graph": {"node": []}}).encode())(folder)


rng = np.random.default_rng(0)

MODELS: dict[str, Builder] = {
    "empty file": _bytes(b""),
    "random bytes": _bytes(rng.bytes(4096)),
    "JSON file": _json_model,
    "text file": _bytes(b"this is not a model\n" * 20),
    "truncated model": _truncated,
    "TensorProto file": _tensor_file,
    "GraphProto file": _graph_file,
    "graph with a cycle": _case(_cycle),
    "initializer raw_data short": _case(_raw_short),
    "initializer raw_data long": _case(_raw_long),
    "initializer dims 2^40": _case(_init_huge),
    "input dims 2^40": _case(_input_huge),
    "initializer dtype UNDEFINED": _case(_undefined_dtype),
    "opset 99": _case(_opset(99)),
    "opset 1": _case(_opset(1)),
    "recursive local function": _case(_recursive_function),
    "non-UTF-8 names": _non_utf8,
    "undefined tensor": _case(_undefined_tensor),
    "two nodes write one tensor": _case(_duplicate_outputs),
    "negative input dim": _case(_negative_dim),
    "negative initializer dim": _case(_negative_init_dim),
    "unknown domain": _case(_unknown_domain),
    "unknown op": _case(_unknown_op),
    "If bodies nested 50 deep": _nested_ifs(50),
    "absolute external-data path": _external("/etc/passwd"),
    "'..' external-data path": _external("../w.bin"),
    "missing external data": _external("w.bin", write=False),
    "short external data": _short_external,
    "Loop of 2^62 trips": _case(_loop(2**62)),
}

DATA: dict[str, Builder] = {
    "data of the wrong dtype": _data(_npz({"x": np.zeros((2, 1, 4), np.int32)})),
    "data of the wrong shape": _data(_npz({"x": np.zeros((2, 1, 5), np.float32)})),
    "data under the wrong name": _data(_npz({"z": np.zeros((2, 1, 4), np.float32)})),
    "pickled .npy": _data(_pickled_npy),
    "pickled .npz member": _data(_pickled_npz),
    "a plain pickle named .npy": _data(_pickle_file),
    "truncated .npz": _data(_truncated_npz),
    ".npy declaring 2^40 rows": _data(_huge_npy),
    ".npz member that is no array": _data(_not_an_array),
}
