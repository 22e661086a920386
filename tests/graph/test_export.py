"""graph.export: onnx-graphsurgeon's export written into one ModelProto (byte-identical
to gs's), and `settle_constants`, which keeps a pass's large new arrays as protos."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from gfhelpers import parse
from onnx_graphsurgeon.ir.tensor import LazyValues
from onnx_graphsurgeon.logger import G_LOGGER

from graphfix import io
from graphfix.graph import constant_value, to_graph
from graphfix.graph.convert import SETTLE_MIN_BYTES, export, settle_constants
from graphfix.graph.export import export_model

BODIES = '<ir_version: 8, opset_import: ["" : 17, "local" : 1]>' + """
g (bool c, float[2] x) => (float[2] y, float[2] z) <float[2] k = {1.0, 2.0}> {
    one = Constant <value = float[2] {1.0, 1.0}> ()
    y = If(c) <
        then_branch = t () => (float[2] ty) { n = Neg(k) ty = Add(x, n) },
        else_branch = e () => (float[2] ey) { ey = Mul(x, one) }
    >
    z = local.scaled <alpha = 2.0> (x)
}
<domain: "local", opset_import: ["" : 17]>
scaled <alpha> (a) => (b) {
    s = Constant <value_float: float = @alpha> ()
    b = Mul(a, s)
}"""


def _gs_bytes(graph: gs.Graph) -> bytes:
    with G_LOGGER.suppress():
        return gs.export_onnx(graph, do_type_check=False).SerializeToString()


@pytest.mark.parametrize("name", ["ssdlite320_mobilenet_v3_large.onnx",
                                  "ch_ppocr_mobile_v2.0_cls_infer.onnx",
                                  "mobilenet_v3_small_bn.onnx"])
def test_the_export_is_byte_identical_to_onnx_graphsurgeons_on_real_models(name, shared_model):
    path = shared_model(name)
    for weights in (True, False):
        graph = to_graph(io.load(str(path), weights=weights))
        assert export_model(graph).SerializeToString() == _gs_bytes(graph)


def test_bodies_functions_and_attribute_references_export_as_gs_does():
    model = parse(BODIES)
    graph = to_graph(model)
    graph.nodes[1].outputs[0].shape = ["n"]  # value_info from a changed annotation too
    ours = export_model(graph)
    assert ours.SerializeToString() == _gs_bytes(graph)
    onnx.checker.check_model(ours, full_check=True)
    assert [f.name for f in ours.functions] == ["scaled"]


def test_large_new_arrays_are_kept_as_protos_and_export_the_same():
    model = parse('<ir_version: 8, opset_import: ["" : 17]>' + """
    g (float[128,128] x) => (float[128,128] y) <float[128,128] w = {1.0}> {
        a = Add(x, w)
        y = Mul(a, w)
    }""".replace("{1.0}", "{" + ", ".join(["1.0"] * 128 * 128) + "}"))
    graph = to_graph(model)
    big = np.arange(128 * 128, dtype=np.float32).reshape(128, 128)
    small = np.ones(4, np.float32)
    graph.nodes[0].inputs[1] = gs.Constant("w_big", big)
    graph.nodes[1].inputs[1] = gs.Constant("w_small", small)
    assert big.nbytes >= SETTLE_MIN_BYTES > small.nbytes
    before = export(graph).SerializeToString()
    assert settle_constants(graph) == 1
    settled, kept = graph.nodes[0].inputs[1], graph.nodes[1].inputs[1]
    assert type(settled._values) is LazyValues and kept._values is small
    np.testing.assert_array_equal(constant_value(settled), big)
    assert export(graph).SerializeToString() == before
    assert settle_constants(graph) == 0  # a second call finds nothing to do
