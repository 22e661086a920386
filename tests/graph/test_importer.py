"""graph.importer: onnx-graphsurgeon's import built directly. The graph must be gs's own,
object for object: the same classes with the same fields in the same order, the same
tensors shared by the same nodes, the same readers and producers, the same lazy values
over the model's own protos."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from gfhelpers import parse
from onnx import TensorProto, helper, numpy_helper
from onnx_graphsurgeon.ir.tensor import LazyValues
from onnx_graphsurgeon.logger import G_LOGGER

from graphfix import io
from graphfix.graph.importer import import_model


def _gs(model: onnx.ModelProto) -> gs.Graph:
    with G_LOGGER.suppress():
        return gs.import_onnx(model)


def _ours(model: onnx.ModelProto) -> gs.Graph:
    with G_LOGGER.suppress():
        return import_model(model)[0]


class _Same:
    """Walks two imports side by side; tensors are matched by the first place each is
    met, so a tensor shared in one must be the one shared in the other."""

    def __init__(self) -> None:
        self.pairs: dict[int, object] = {}
        self.graphs: list[tuple[gs.Graph, gs.Graph]] = []

    def tensor(self, a: gs.Tensor, b: gs.Tensor, where: str) -> None:
        if id(a) in self.pairs:
            assert self.pairs[id(a)] is b, f"{where}: shared differently"
            return
        self.pairs[id(a)] = b
        assert type(a) is type(b), where
        fa, fb = vars(a), vars(b)
        assert list(fa) == list(fb), where
        for key, x in fa.items():
            y = fb[key]
            if key in ("inputs", "outputs"):
                _same_list(x, y, a, b, f"{where}.{key}")
                assert [n.name for n in x] == [n.name for n in y], f"{where}.{key}"
            elif key == "_values":
                assert type(x) is type(y), where
                if isinstance(x, LazyValues):
                    assert list(vars(x)) == list(vars(y)), where
                    assert x.tensor is y.tensor, f"{where}: not the model's own proto"
                    assert type(x.shape) is type(y.shape) and list(x.shape) == list(y.shape)
                    assert (x.dtype, x.nbytes) == (y.dtype, y.nbytes), where
            else:
                assert type(x) is type(y) and x == y, f"{where}.{key}: {x!r} vs {y!r}"

    def graph(self, a: gs.Graph, b: gs.Graph, where: str = "graph") -> None:
        assert list(vars(a)) == list(vars(b)), where
        for key in ("name", "doc_string", "opset", "producer_name", "producer_version",
                    "ir_version", "name_idx"):
            assert getattr(a, key) == getattr(b, key), f"{where}.{key}"
        assert a.import_domains == b.import_domains, where
        assert len(a.inputs) == len(b.inputs) and len(a.outputs) == len(b.outputs), where
        for x, y in zip(a.inputs + a.outputs, b.inputs + b.outputs, strict=True):
            self.tensor(x, y, f"{where} io '{x.name}'")
        assert len(a.nodes) == len(b.nodes), where
        for i, (n, m) in enumerate(zip(a.nodes, b.nodes, strict=True)):
            at = f"{where} node {i} ({n.op})"
            assert type(n) is type(m) and list(vars(n)) == list(vars(m)), at
            self.pairs[id(n)] = m
            _same_list(n.inputs, m.inputs, n, m, f"{at}.inputs")
            _same_list(n.outputs, m.outputs, n, m, f"{at}.outputs")
            assert (n.op, n.name, n.domain) == (m.op, m.name, m.domain), at
            assert type(n.attrs) is type(m.attrs) and list(n.attrs) == list(m.attrs), at
            for key, x in n.attrs.items():
                y = m.attrs[key]
                assert type(x) is type(y), f"{at}.{key}"
                if isinstance(x, gs.Graph):
                    self.graph(x, y, f"{at}.{key}")
                elif isinstance(x, gs.Tensor):
                    self.tensor(x, y, f"{at}.{key}")
                else:
                    assert x == y, f"{at}.{key}"
            for x, y in zip(n.inputs + n.outputs, m.inputs + m.outputs, strict=True):
                self.tensor(x, y, f"{at} '{x.name}'")
        self.graphs.append((a, b))

    def readers(self) -> None:
        """Every tensor's readers and producers, in order (once the whole walk matched
        every node: a body's tensors include outer ones read by later nodes)."""
        for a, b in self.graphs:
            theirs = b.tensors()
            for name, x in a.tensors().items():
                y = theirs[name]
                for key in ("inputs", "outputs"):
                    assert [self.pairs[id(n)] for n in getattr(x, key)] == \
                        list(getattr(y, key)), f"{name}.{key}"


def _same_list(x, y, a, b, where: str) -> None:
    """Two SynchronizedLists alike: each belongs to its own object, for the same field."""
    assert type(x) is type(y), where
    assert list(vars(x)) == list(vars(y)), where
    assert x.parent_obj is a and y.parent_obj is b, where
    assert x.field_name == y.field_name, where


def _assert_same_import(model: onnx.ModelProto) -> gs.Graph:
    before = model.SerializeToString()
    ours = _ours(model)
    theirs = _gs(model)
    assert model.SerializeToString() == before  # an import only reads
    same = _Same()
    same.graph(theirs, ours)
    same.readers()
    with G_LOGGER.suppress():  # (gs's export writes into the model: compared last)
        assert gs.export_onnx(ours, do_type_check=False).SerializeToString() == \
            gs.export_onnx(theirs, do_type_check=False).SerializeToString()
    return ours


@pytest.mark.parametrize("name", ["ssdlite320_mobilenet_v3_large.onnx",
                                  "ch_ppocr_mobile_v2.0_cls_infer.onnx",
                                  "mobilenet_v3_small_bn.onnx", "digits_dev.onnx"])
def test_real_models_import_as_gs_imports_them(name, shared_model):
    path = str(shared_model(name))
    for weights in (True, False):  # inline weights, and weights left in the file
        _assert_same_import(io.load(path, weights=weights))


def test_bodies_functions_sparse_and_odd_attributes_import_as_gs_imports_them():
    from test_export import BODIES  # an If reading outer tensors, a local function

    model = parse(BODIES)
    assert model.functions  # a model with functions: gs's own import, whole
    _assert_same_import(model)
    assert import_model(model)[1]
    del model.functions[:]
    model.graph.node[2].domain = "other"
    _assert_same_import(model)  # the If's bodies: gs's, through the node's attributes
    assert import_model(model)[1]  # gs imported a body


def _odd_model() -> onnx.ModelProto:
    """Everything rare a main graph can hold, in one model."""
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    bf = helper.make_tensor("bf", TensorProto.BFLOAT16, [2], [1.0, 2.0])  # numpy has none
    dup = numpy_helper.from_array(np.ones(2, np.float32), "w")  # a second 'w': ignored
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([5.0], np.float32), "sp"),
        numpy_helper.from_array(np.array([1], np.int64), "sp_idx"), [3])
    nodes = [
        helper.make_node("Add", ["x", "w"], ["a"], name="add"),
        helper.make_node("Clip", ["a", "", "hi"], ["c"], name="clip"),  # omitted input
        helper.make_node("Constant", [], ["hi"], name="k",
                         value=numpy_helper.from_array(np.array(2.0, np.float32))),
        helper.make_node("Cast", ["c"], ["d"], to=TensorProto.DOUBLE),
        helper.make_node("Identity", ["bf"], ["bf_out"]),
        helper.make_node("Identity", ["sp"], ["sp_out"]),
        helper.make_node("Concat", ["d", "d"], ["e"], axis=0, domain="",
                         note_floats=[0.5, 1.5], note_strings=[b"a", "\u00e9".encode()],
                         note_string="s", note_float=1.25),
        helper.make_node("SequenceConstruct", ["x"], ["seq"]),
        helper.make_node("Split", ["e"], ["s0", ""], axis=0),  # omitted output
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Identity", ["untyped"], ["untyped_out"]),
        helper.make_node("Unknown", ["x"], ["u"], domain="acme",
                         typed=helper.make_tensor_type_proto(f32, [1])),
    ]
    graph = helper.make_graph(
        nodes, "odd",
        [helper.make_tensor_value_info("x", f32, ["n", 3]),
         helper.make_tensor_value_info("w", f32, [2, 3]),  # an input that is an initializer
         helper.make_tensor_value_info("blank", 0, None),
         helper.make_value_info("untyped", onnx.TypeProto())],
        [helper.make_tensor_value_info("e", TensorProto.DOUBLE, None),
         helper.make_tensor_value_info("bf_out", TensorProto.BFLOAT16, [2]),
         helper.make_tensor_value_info("sp_out", f32, [3]),
         helper.make_value_info("seq", helper.make_sequence_type_proto(
             helper.make_tensor_type_proto(f32, None))),
         helper.make_tensor_value_info("s0", TensorProto.DOUBLE, [None, 3]),
         helper.make_tensor_value_info("shp", i64, [2]),
         helper.make_tensor_value_info("u", f32, []),
         helper.make_tensor_value_info("untyped_out", f32, None)],
        [w, bf, dup], sparse_initializer=[sparse],
        value_info=[helper.make_tensor_value_info("a", f32, None),  # a name twice:
                    helper.make_tensor_value_info("a", f32, ["n", 3]),  # shape filled in
                    helper.make_tensor_value_info("a", f32, None),  # and kept
                    helper.make_tensor_value_info("c", 0, [2, 3]),  # undefined type
                    helper.make_tensor_value_info("w", f32, [2, 3]),  # an initializer's
                    helper.make_tensor_value_info("d", TensorProto.DOUBLE, []),
                    helper.make_tensor_value_info("d", TensorProto.DOUBLE, [2, 3]),
                    helper.make_value_info("empty", onnx.TypeProto())])
    graph.value_info[-2].type.tensor_type.shape.dim[0].ClearField("dim_value")  # no value
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("acme", 1)])
    model.producer_name, model.producer_version, model.doc_string = "p", "1", "doc"
    return model


def test_every_rare_case_of_a_main_graph_imports_as_gs_imports_it():
    graph = _assert_same_import(_odd_model())
    clip = graph.nodes[1]
    assert clip.inputs[1].name == "" and clip.inputs[1] not in graph.tensors().values()
    assert type(graph.tensors()["w"]._values) is LazyValues
    assert graph.tensors()["a"].shape == ["n", 3]  # a shape once given is kept
    assert "typed" not in graph.nodes[-1].attrs  # gs drops a TYPE_PROTO attribute


def test_type_attributes_are_kept_when_asked_and_bodies_are_said():
    model = _odd_model()
    with G_LOGGER.suppress():
        graph, bodies = import_model(model, keep_types=True)
    assert not bodies
    unknown = graph.nodes[-1]
    assert list(unknown.attrs) == ["typed"]
    assert unknown.attrs["typed"] == model.graph.node[-1].attribute[0].tp
    assert graph.tensors()["d"].shape == [None, 3]  # [] is no shape to gs: the later one
