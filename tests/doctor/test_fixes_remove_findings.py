"""Every pass a doctor finding names as its fix removes that finding.

For each rule whose fix names a registered pass: a model where the rule fires, the named
passes run through `graphfix.run` (checked in onnxruntime where it can run the model),
doctor again on the same TensorRT version: the finding is gone (no finding of that rule
on that op at the same severity or worse) and no new error appears. The last test keeps
the table complete: every pass a rule module names is run by some case here.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from doctorhelpers import model, vi
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import graphfix
from graphfix.doctor import Finding, diagnose
from graphfix.doctor.findings import SEVERITIES
from graphfix.passes.registry import REGISTRY
from graphfix.plugins.nodes import plugin_node
from graphfix.report import ROLLED_BACK
from graphfix.trt import parse_target

F, I64 = TP.FLOAT, TP.INT64
DOCTOR = Path(graphfix.__file__).parent / "doctor"


def const(name: str, value, dtype=np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


# ----------------------------------------------------------------------------- models


def relu_opset_18() -> onnx.ModelProto:
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                 [vi("x", F, [1, 3])], [vi("y", F, [1, 3])], opset=18)


def layer_norm() -> onnx.ModelProto:
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], name="ln", axis=-1)
    return model([node], [vi("x", F, [2, 4])], [vi("y", F, [2, 4])],
                 [const("g", np.ones(4), np.float32), const("b", np.zeros(4), np.float32)])


def einsum_leading_ellipsis() -> onnx.ModelProto:
    """A batched matmul written as Einsum with an ellipsis (TensorRT 8.6 refuses those)."""
    node = helper.make_node("Einsum", ["a", "b"], ["y"], name="ein",
                            equation="...ij,...jk->...ik")
    return model([node], [vi("a", F, [2, 3, 4]), vi("b", F, [2, 4, 5])], [vi("y", F, [2, 3, 5])])


def int64_tensor_scatter() -> onnx.ModelProto:
    node = helper.make_node("TensorScatter", ["cache", "update"], ["y"], name="ts")
    m = model([node], [vi("cache", I64, [1, 2, 16, 8]), vi("update", I64, [1, 2, 1, 8])],
              [vi("y", I64, [1, 2, 16, 8])], opset=24)
    m.ir_version = 11
    return m


def computed_axes() -> onnx.ModelProto:
    """ReduceSum whose axes are Add(1, 0) of constants: computed, but foldable."""
    nodes = [helper.make_node("Add", ["one", "zero"], ["axes"], name="add"),
             helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum")]
    return model(nodes, [vi("x", F, [2, 3])], [vi("y", F, [2, 1])],
                 [const("one", [1]), const("zero", [0])], opset=18)


def dynamic_eye_like() -> onnx.ModelProto:
    return model([helper.make_node("EyeLike", ["x"], ["y"], name="eye")],
                 [vi("x", F, ["n", 4])], [vi("y", F, ["n", 4])])


def computed_dropout_mode() -> onnx.ModelProto:
    """Dropout whose training_mode is Not(true): computed, false once folded."""
    nodes = [helper.make_node("Not", ["on"], ["mode"], name="not"),
             helper.make_node("Dropout", ["x", "", "mode"], ["d"], name="drop"),
             helper.make_node("Relu", ["d"], ["y"], name="relu")]
    return model(nodes, [vi("x", F, [2, 3])], [vi("y", F, [2, 3])],
                 [const("on", True, np.bool_)])


def if_squeeze_on_batch() -> onnx.ModelProto:
    """torch's `x.squeeze(0)` on a dynamic batch: If(dim 0 == 1) Squeeze else Identity,
    branches of rank 1 and 2 (silero_vad's pattern)."""
    then = helper.make_graph([helper.make_node("Squeeze", ["x", "axis0"], ["t"])], "then", [],
                             [vi("t", F, [3])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [vi("e", F, ["n", 3])])
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "zero"], ["n0"], name="dim0", axis=0),
             helper.make_node("Equal", ["n0", "one"], ["is_one"], name="eq"),
             helper.make_node("If", ["is_one"], ["y"], name="if", then_branch=then,
                              else_branch=other)]
    return model(nodes, [vi("x", F, ["n", 3])], [vi("y", F, None)],
                 [const("zero", 0), const("one", 1), const("axis0", [0])])


def fused_conv() -> onnx.ModelProto:
    node = helper.make_node("FusedConv", ["x", "w"], ["y"], name="fc", domain="com.microsoft",
                            activation="Relu")
    return model([node], [vi("x", F, [1, 2, 5, 5])], [vi("y", F, [1, 2, 5, 5])],
                 [const("w", np.full((2, 2, 1, 1), 0.5), np.float32)],
                 domains=["com.microsoft"])


def gelu_plugin() -> onnx.ModelProto:
    """CustomGeluPluginDynamic: deprecated from TensorRT 9.0, removed in 11.0."""
    node = plugin_node("CustomGeluPluginDynamic", ["x"], ["y"], {"type_id": 0}, name="gelu")
    return model([node], [vi("x", F, [2, 8])], [vi("y", F, [2, 8])])


def _boxes_and_scores() -> list[onnx.NodeProto]:
    return [helper.make_node("Slice", ["feats", "s0", "s4", "ax2"], ["boxes"], name="boxes"),
            helper.make_node("Slice", ["feats", "s4", "s7", "ax2"], ["logits"], name="logit"),
            helper.make_node("Sigmoid", ["logits"], ["scores"], name="sigmoid")]


_HEAD_INITS = [const("s0", [0]), const("s4", [4]), const("s7", [7]), const("ax2", [2])]


def onnx_nms(cap: int = 4) -> onnx.ModelProto:
    """feats [1, 12, 7] -> boxes, scores -> NonMaxSuppression (per-class cap `cap`)."""
    nodes = [*_boxes_and_scores(),
             helper.make_node("Transpose", ["scores"], ["scores_t"], name="t", perm=[0, 2, 1]),
             helper.make_node("NonMaxSuppression", ["boxes", "scores_t", "cap", "iou", "thr"],
                              ["sel"], name="nms")]
    inits = [*_HEAD_INITS, const("cap", [cap]), const("iou", [0.5], np.float32),
             const("thr", [0.3], np.float32)]
    return model(nodes, [vi("feats", F, [1, 12, 7])], [vi("sel", I64, [None, 3])], inits)


def efficient_nms_plugin() -> onnx.ModelProto:
    """EfficientNMS_TRT (deprecated from TensorRT 10.12) on the same heads."""
    nms = plugin_node("EfficientNMS_TRT", ["boxes", "scores"],
                      ["num", "det_boxes", "det_scores", "det_classes"],
                      {"score_threshold": 0.3, "iou_threshold": 0.5, "max_output_boxes": 10,
                       "background_class": -1, "score_activation": 0, "box_coding": 0},
                      name="plugin_nms")
    outs = [vi("num", TP.INT32, [1, 1]), vi("det_boxes", F, [1, 10, 4]),
            vi("det_scores", F, [1, 10]), vi("det_classes", TP.INT32, [1, 10])]
    return model([*_boxes_and_scores(), nms], [vi("feats", F, [1, 12, 7])], outs, _HEAD_INITS)


def dynamic_batch() -> onnx.ModelProto:
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                 [vi("x", F, ["N", 3, 8, 8])], [vi("y", F, ["N", 3, 8, 8])])


def int64_input() -> onnx.ModelProto:
    return model([helper.make_node("Cast", ["x"], ["y"], name="cast", to=F)],
                 [vi("x", I64, [4])], [vi("y", F, [4])])


def local_function() -> onnx.ModelProto:
    """Two calls of a model-local function (PyTorch's export_modules_as_functions)."""
    block = helper.make_function(
        "pkg", "Block", ["a", "w"], ["b"],
        [helper.make_node("Conv", ["a", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["r", "a"], ["b"])],
        [helper.make_opsetid("", 17)])
    weights = np.random.default_rng(0).standard_normal((3, 3, 3, 3)).astype(np.float32)
    m = model([helper.make_node("Block", ["x", "w"], ["h"], name="blk1", domain="pkg"),
               helper.make_node("Block", ["h", "w"], ["y"], name="blk2", domain="pkg")],
              [vi("x", F, [1, 3, 8, 8])], [vi("y", F, [1, 3, 8, 8])],
              [numpy_helper.from_array(weights * 0.2, "w")])
    m.functions.append(block)
    m.opset_import.append(helper.make_opsetid("pkg", 1))
    return m


def qdq_int32_bias() -> onnx.ModelProto:
    """onnxruntime quantize_static's Q/DQ Conv: int8 input and per-channel weights, and an
    INT32 bias dequantized with scale = input scale * weight scale."""
    rng = np.random.default_rng(0)
    w_scale = (rng.random(4) * 0.01 + 0.001).astype(np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dq"),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="dqw",
                              axis=0),
             helper.make_node("DequantizeLinear", ["bq", "bs", "bz"], ["bd"], name="dqb",
                              axis=0),
             helper.make_node("Conv", ["xd", "wd", "bd"], ["y"], name="conv")]
    inits = [const("xs", 0.02, np.float32), const("xz", 0, np.int8),
             const("wq", rng.integers(-127, 128, (4, 3, 1, 1)), np.int8),
             const("ws", w_scale, np.float32), const("wz", np.zeros(4), np.int8),
             const("bq", rng.integers(-5000, 5000, 4), np.int32),
             const("bs", w_scale * np.float32(0.02), np.float32),
             const("bz", np.zeros(4), np.int32)]
    return model(nodes, [vi("x", F, [1, 3, 4, 4])], [vi("y", F, [1, 4, 4, 4])], inits)


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """`build()` fires `rule` (on `op`) at `trt`; `passes` is the named fix, filled in."""

    rule: str
    op: str
    build: Callable[[], onnx.ModelProto]
    trt: str
    passes: str
    check: bool = True  # compare outputs in onnxruntime after each pass

    @property
    def id(self) -> str:
        return f"{self.rule}[{self.op or '-'}]@{self.trt}:{self.passes}"


CASES = (
    Case("opset-out-of-range", "", relu_opset_18, "8.6", "opset{version=17}"),
    Case("op-unsupported", "LayerNormalization", layer_norm, "8.4", "lower-unsupported"),
    Case("dtype-unsupported", "TensorScatter", int64_tensor_scatter, "10.16", "int64-to-int32"),
    Case("restriction-violated", "ReduceSum", computed_axes, "10.16", "fold-constants"),
    Case("restriction-violated", "Einsum", einsum_leading_ellipsis, "8.6", "lower-unsupported"),
    Case("restriction-violated", "EyeLike", dynamic_eye_like, "10.16",
         "fix-shapes{x=3x4},fold-constants"),
    Case("restriction-violated", "Dropout", computed_dropout_mode, "10.16",
         "fold-constants,eliminate-noops"),
    Case("restriction-violated", "If", if_squeeze_on_batch, "10.16",
         "fix-shapes{x=1x3},fold-constants"),
    Case("domain-nonstandard", "com.microsoft::FusedConv", fused_conv, "10.16",
         "unfuse-contrib"),
    Case("plugin-deprecated", "CustomGeluPluginDynamic", gelu_plugin, "10.16",
         "migrate-plugins"),
    Case("plugin-removed", "CustomGeluPluginDynamic", gelu_plugin, "11.1", "migrate-plugins"),
    Case("nms-strategy", "NonMaxSuppression", lambda: onnx_nms(100), "8.4", "nms-to-plugin",
         check=False),
    Case("nms-strategy", "NonMaxSuppression", onnx_nms, "8.4", "split-nms"),
    Case("nms-strategy", "NonMaxSuppression", lambda: onnx_nms(2**63 - 1), "10.16",
         "bound-nms"),
    Case("nms-strategy", "EfficientNMS_TRT", efficient_nms_plugin, "10.16", "plugin-to-nms"),
    Case("dynamic-input", "", dynamic_batch, "10.16", "fix-shapes{x=1x3x8x8}"),
    Case("int64-input", "", int64_input, "8.6", "int64-to-int32"),
    Case("custom-op-unknown", "pkg::Block", local_function, "8.6", "inline-functions"),
    Case("dtype-unsupported", "DequantizeLinear", qdq_int32_bias, "10.16", "lower-unsupported"),
)


def _rank(finding: Finding) -> int:
    return len(SEVERITIES) - SEVERITIES.index(finding.severity)


def _named(fix: str) -> set[str]:
    """The registered passes a fix text names."""
    return {name for name in REGISTRY if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])",
                                                   fix)}


def _passes_of(pipeline: str) -> set[str]:
    return {re.sub(r"\{.*", "", item) for item in re.split(r",(?![^{]*\})", pipeline)}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_named_fix_removes_the_finding(case: Case):
    target = parse_target(case.trt)
    source = case.build()
    before = diagnose(source, target).findings
    fired = [f for f in before if (f.rule, f.op) == (case.rule, case.op)]
    assert fired, [(f.rule, f.op, f.message) for f in before]
    worst = max(fired, key=_rank)
    assert _passes_of(case.passes) <= _named(worst.fix), worst.fix  # the fix names them

    result = graphfix.run(source, passes=case.passes, trt=case.trt, check=case.check)
    assert ROLLED_BACK not in [p.status for p in result.report.passes]
    after = diagnose(result.model, target).findings

    still = [f for f in after if (f.rule, f.op) == (case.rule, case.op)
             and _rank(f) >= _rank(worst)]
    assert still == []
    new_errors = ({(f.rule, f.op) for f in after if f.severity == "error"}
                  - {(f.rule, f.op) for f in before if f.severity == "error"})
    assert new_errors == set()


def test_int64_overflow_names_no_pass_since_int64_to_int32_keeps_such_values():
    """int64-to-int32 never truncates: a value outside INT32 keeps its island INT64, so
    the fix is a change to the model (or a newer TensorRT), not that pass."""
    big = const("big", [1, 2**31 + 5])
    source = model([helper.make_node("Add", ["x", "big"], ["y"], name="add")],
                   [vi("x", I64, [2])], [vi("y", I64, [2])], [big])
    target = parse_target("8.6")
    overflow = [f for f in diagnose(source, target).findings if f.rule == "int64-overflow"]
    assert [_named(f.fix) for f in overflow] == [set()]
    result = graphfix.run(source, passes="int64-to-int32", trt="8.6")
    assert [f.message for f in diagnose(result.model, target).findings
            if f.rule == "int64-overflow"] == [overflow[0].message]


def _pass_names_in_rules() -> set[str]:
    """Registered pass names in the string literals (not docstrings) of doctor's rule and
    restriction modules; a name without a hyphen counts only with options (`opset{`)."""
    found: set[str] = set()
    for path in [*DOCTOR.glob("rules_*.py"), *DOCTOR.glob("restriction_*.py")]:
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef)
                      and n.body and isinstance(n.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docstrings:
                found |= {name for name in _named(node.value)
                          if "-" in name or f"{name}{{" in node.value}
    return found


def test_every_pass_a_rule_names_is_run_by_a_case():
    run = set().union(*(_passes_of(c.passes) for c in CASES))
    assert _pass_names_in_rules() <= run
