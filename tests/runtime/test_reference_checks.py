"""Reference forms under the two checks: a pass that inserts a TensorRT plugin node is
checked by the per-pass check (kept when right, rolled back when wrong), a node without a
reference is "not checkable" (rolled back, never passed), and `graphfix check` compares a
model with InstanceNormalization_TRT layer by layer."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import helper, numpy_helper

from graphfix.check.layerwise import compare_layerwise
from graphfix.errors import GraphfixError
from graphfix.passes.base import NoOptions, Pass, PassContext, PassResult
from graphfix.passes.manager import run_passes
from graphfix.report import APPLIED, ROLLED_BACK
from graphfix.runtime.feeds import graph_inputs, resolve_shapes
from graphfix.runtime.outputs import OutputCheck

C = 4


def _model():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((C, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array((rng.random(C) + 0.5).astype(np.float32), "s"),
             numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("InstanceNormalization", ["c", "s", "b"], ["n"], name="in",
                              epsilon=1e-5),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", 1, [1, C, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


class ToPlugin(Pass):
    """Test-only: InstanceNormalization -> InstanceNormalization_TRT, as a plugin-substitution
    pass will; `scale_error` makes it wrong, `op` writes another (unknown) op."""

    name = "to-plugin"
    summary = "test only"
    Options = NoOptions

    def __init__(self, scale_error: float = 0.0, op: str = "InstanceNormalization_TRT",
                 domain: str = "") -> None:
        super().__init__()
        self.scale_error, self.op, self.domain = scale_error, op, domain

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        for node in [n for n in graph.nodes if n.op == "InstanceNormalization"]:
            scales = np.asarray(node.inputs[1].values, np.float32) * (1 + self.scale_error)
            node.op, node.domain = self.op, self.domain
            node.attrs = {"epsilon": float(node.attrs.get("epsilon", 1e-5)),
                          "scales": [float(v) for v in scales],
                          "bias": [float(v) for v in node.inputs[2].values],
                          "relu": 0, "alpha": 0.0, "plugin_version": "1",
                          "plugin_namespace": ""}
            node.inputs = [node.inputs[0]]
            result.changed = True
            result.counts[f"substituted {self.op}"] += 1
        return result


def _run(model, pass_):
    check = OutputCheck.prepare(model, resolve_shapes(graph_inputs(model)))
    out, report = run_passes(model, [(pass_.name, pass_)], check, PassContext())
    return out, report.passes[0]


def test_a_plugin_node_is_checked_through_its_reference():
    out, record = _run(_model(), ToPlugin())
    assert record.status == APPLIED, record.rollback_reason
    assert [n.op_type for n in out.graph.node] == ["Conv", "InstanceNormalization_TRT", "Relu"]
    assert record.check.startswith("passed")


def test_a_wrong_plugin_substitution_is_rolled_back():
    out, record = _run(_model(), ToPlugin(scale_error=0.01))
    assert record.status == ROLLED_BACK
    assert record.rollback_reason.startswith("outputs differ: y: max abs")
    assert [n.op_type for n in out.graph.node] == ["Conv", "InstanceNormalization", "Relu"]


def test_a_node_without_reference_is_not_checkable_and_rolled_back():
    _, record = _run(_model(), ToPlugin(op="MysteryNorm", domain="custom.ops"))
    assert record.status == ROLLED_BACK
    assert record.rollback_reason == "not checkable: MysteryNorm (custom.ops)"


def test_an_input_model_with_a_plugin_is_checked():
    plugin, _ = _run(_model(), ToPlugin())
    check = OutputCheck.prepare(plugin, resolve_shapes(graph_inputs(plugin)))
    assert check.enabled
    assert check.verify(_model()).ok  # the standard op against the plugin's reference
    unknown = plugin.__class__()
    unknown.CopyFrom(plugin)
    unknown.graph.node[1].op_type, unknown.graph.node[1].domain = "MysteryNorm", "custom.ops"
    unknown.opset_import.append(helper.make_opsetid("custom.ops", 1))
    skipped = OutputCheck.prepare(unknown, resolve_shapes(graph_inputs(unknown)))
    assert not skipped.enabled
    assert skipped.skipped_reason.startswith("not checkable: MysteryNorm (custom.ops): ")


def _samples():
    rng = np.random.default_rng(3)
    return [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(2)]


def test_graphfix_check_compares_a_plugin_model_layer_by_layer():
    model = _model()
    plugin, _ = _run(model, ToPlugin())
    report = compare_layerwise(model, plugin, _samples())
    assert report.passed
    assert {t.name: t.ok for t in report.tensors if t.ok is not None} == {
        "x": True, "c": True, "n": True, "y": True}
    assert any("reference forms ran in place" in n and "InstanceNormalization_TRT" in n
               for n in report.notes)
    graph = gs.import_onnx(model)
    ToPlugin(scale_error=0.01).run(graph, PassContext())
    report = compare_layerwise(model, gs.export_onnx(graph), _samples())
    assert not report.passed and report.first_divergence.name == "n"


def test_graphfix_check_refuses_a_node_without_reference():
    model = _model()
    graph = gs.import_onnx(model)
    ToPlugin(op="MysteryNorm", domain="custom.ops").run(graph, PassContext())
    unknown = gs.export_onnx(graph)
    with pytest.raises(GraphfixError, match=r"CANDIDATE cannot be compared: not checkable: "
                                            r"MysteryNorm \(custom.ops\)"):
        compare_layerwise(model, unknown, _samples())
