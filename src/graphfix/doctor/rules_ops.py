"""Doctor rules about operators: support in the target's parser, dtypes, opset, domains.

Every claim comes from the target's operator matrix (`graphfix.trt`, shipped from
../shared/trt/onnx_trt_operators.json); the finding's `fact` quotes it.
"""

from __future__ import annotations

from collections.abc import Iterator

from graphfix.doctor.findings import ERROR, RUN_BY_TRT, WARN, Finding
from graphfix.doctor.rules_plugins import handles as plugin_handles
from graphfix.doctor.view import ModelView, NodeRef
from graphfix.graph.ort_ops import MS_REWRITES
from graphfix.plugins.retype import (
    ELEMENTWISE_OPS,
    ELEMENTWISE_TERMS,
    FLOAT_FILLS,
    float_fill_refusal,
    retypes,
)
from graphfix.trt import OpSupport, TrtTarget, documented_versions, parse_target

# Ops whose first input is not the tensor the Types column describes: the input to read.
_TYPED_INPUT = {"Where": 1, "ConstantOfShape": -1, "Shape": None, "Size": None,
                "EyeLike": None, "RandomNormalLike": None, "RandomUniformLike": None,
                "Cast": None, "CastLike": None, "If": None, "Loop": None, "Scan": None,
                "QuantizeLinear": 0, "DequantizeLinear": 0, "Constant": -1}
_NCHWC = "com.microsoft.nchwc"


def op_support(view: ModelView, target: TrtTarget) -> Iterator[Finding]:
    """`op-unsupported` (error) and `op-experimental` (warn), one finding per op type."""
    by_op: dict[str, list[NodeRef]] = {}
    for ref in view.nodes:
        if ref.standard and not plugin_handles(ref, target):  # plugin ops: rules_plugins
            by_op.setdefault(ref.op, []).append(ref)
    for op, refs in by_op.items():
        row = target.op(op)
        nodes = tuple(r.label for r in refs)
        if row is None or not row.supported:
            listed = "not listed" if row is None else "listed as unsupported"
            yield Finding(
                "op-unsupported", ERROR,
                f"{op} is {listed} in the TensorRT {target.version} ONNX operator table "
                f"({len(refs)} node{'s' * (len(refs) != 1)})",
                nodes=nodes, op=op,
                fact=f"matrix {target.version}: {op} {listed}",
                fix=_unsupported_fix(op, target),
            )
        elif row.experimental:
            yield Finding(
                "op-experimental", WARN,
                f"{op} is supported only as EXPERIMENTAL by TensorRT {target.version}",
                nodes=nodes, op=op, fact=f"matrix {row.matrix}: {op} Y* (experimental)",
                fix="check the engine's outputs against onnxruntime (graphfix check)",
            )


def _unsupported_fix(op: str, target: TrtTarget) -> str:
    later = [v for v in documented_versions()
             if _num(v) > _num(target.version) and (row := parse_target(v).op(op)) is not None
             and row.supported]
    newer = f"TensorRT {later[0]} supports it; otherwise " if later else ""
    from graphfix.plugins.lowering import lowering_for  # onnx-graphsurgeon, only when needed
    from graphfix.plugins.substitute import substitution_advice

    if lowering_for(op, target) is not None:
        return (f"{newer}lower-unsupported rewrites it into ops this version parses: "
                f"graphfix run model.onnx --trt {target.effective} --passes lower-unsupported")
    if advice := substitution_advice("", op, target):
        return f"{newer}{advice}"
    if op in QUANTIZER_OPS:
        return f"{newer}{QUANTIZED_FIX}"
    return (f"{newer}rewrite that part of the model before export or "
            "implement the op as a TensorRT plugin")


QUANTIZER_OPS = frozenset({
    "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear",
    "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QLinearAveragePool",
    "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", "QGemm",
    "QLinearReduceMean", "QLinearWhere", "QAttention", "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat", "DynamicQuantizeLSTM", "QEmbedLayerNormalization",
    # its weight-only (block-wise 4-bit) quantizers
    "MatMulNBits", "MatMulBnb4", "MatMulFpQ4", "GatherBlockQuantized",
})
"""Ops onnxruntime's quantizer writes in its QOperator format (quantize_static with
quant_format=QOperator), for dynamic quantization (quantize_dynamic) and weight-only
4-bit quantization (MatMulNBits, ...), in the ONNX or the com.microsoft domain. TensorRT
takes quantized models as standard Q/DQ pairs around float ops."""
_MS_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})
"""onnxruntime's com.microsoft Q/DQ (its QDQ with contrib ops, for 16-bit and 4-bit)."""

QUANTIZED_FIX = (
    "this op comes from onnxruntime's quantizer (QOperator format, dynamic or weight-only "
    "quantization), which TensorRT does not read: quantize the float model to Q/DQ instead "
    "(graphfix calibrate model.onnx --data ..., or onnxruntime quantize_static with "
    "quant_format=QDQ and symmetric INT8 activations and weights)")


def _num(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def supported_nodes(view: ModelView, target: TrtTarget) -> Iterator[tuple[NodeRef, OpSupport]]:
    """Every ai.onnx node whose op the target's matrix lists as supported, with its row."""
    for ref in view.nodes:
        if ref.standard:
            row = target.op(ref.op)
            if row is not None and row.supported:
                yield ref, row


def dtype_support(view: ModelView, target: TrtTarget) -> Iterator[Finding]:
    """`dtype-unsupported` (error), `dtype-cast-down` (warn): the typed tensor of each
    supported op against the matrix's Supported Types column."""
    grouped: dict[tuple[str, str, str], list[NodeRef]] = {}
    for ref, row in supported_nodes(view, target):
        name = _typed_tensor(ref)
        type_name = target.unlisted_type(ref.op, view.elem_type(name)) if name else None
        if type_name is None:
            continue
        if type_name in ("INT8", "UINT8") and ref.op in ("QuantizeLinear", "DequantizeLinear"):
            continue
        grouped.setdefault((ref.op, type_name, ", ".join(row.types)), []).append(ref)
    for (op, type_name, listed), refs in grouped.items():
        fact = f"matrix {target.version}: {op} supported types {listed}"
        if type_name == "DOUBLE":
            yield Finding(
                "dtype-cast-down", WARN,
                f"{op} reads DOUBLE tensors; TensorRT casts DOUBLE to FP32, clamping to +-FLT_MAX",
                nodes=tuple(r.label for r in refs), op=op, fact=fact,
                fix="export the model in float32",
            )
            continue
        yield Finding(
            "dtype-unsupported", ERROR,
            f"{op} on {type_name} tensors: the TensorRT {target.version} operator table "
            f"lists {op} for {listed} only",
            nodes=tuple(r.label for r in refs), tensors=tuple(
                _typed_tensor(r) for r in refs), op=op, fact=fact,
            fix=_dtype_fix(type_name, op, listed, target),
        )


def _typed_tensor(ref: NodeRef) -> str:
    index = _TYPED_INPUT.get(ref.op, 0)
    if index is None:
        return ""
    if index == -1:
        return ref.node.output[0] if ref.node.output else ""
    return ref.input(index)


def _dtype_fix(type_name: str, op: str, listed: str, target: TrtTarget) -> str:
    """`listed`: the types the table lists for `op`, as "FP32, INT32"."""
    if op == "DequantizeLinear" and type_name == "INT32":
        return ("keep biases in float: lower-unsupported (the default --trt pipeline runs "
                "it) stores a constant bias's dequantized values as a float initializer, "
                "exactly (TensorRT quantizes biases itself; graphfix calibrate puts no Q/DQ "
                "on bias)")
    if op == "ConstantOfShape" and type_name in FLOAT_FILLS:
        return _float_fill_fix(type_name, target)
    fix = _cast_fix(type_name, op, listed)
    if op == "ConstantOfShape":  # its only input is the shape: nothing to Cast before it
        fix = (f"export the fill's value as {listed.split(', ')[0]} (its only input is "
               "the shape, so there is nothing to Cast before it), or target a TensorRT "
               f"version that lists ConstantOfShape for {type_name}")
    if retypes(op, type_name) and op in ELEMENTWISE_OPS:
        return (f"lower-unsupported {RUN_BY_TRT} computes {op} "
                "exactly where it reduces at most "
                f"{ELEMENTWISE_TERMS} elements of static extent (slice by slice: Gather and "
                f"{ELEMENTWISE_OPS[op]} in {type_name}) or a BOOL tensor cast to an integer "
                f"type (in FP32); elsewhere: {fix}")
    if retypes(op, type_name) and op == "Clip":
        return (f"lower-unsupported {RUN_BY_TRT} computes Clip as Max and Min in "
                f"{type_name}, exactly, where the table lists Max and Min for {type_name}; "
                f"elsewhere: {fix}")
    if retypes(op, type_name):
        masked = (f", else as a sum under a triangular mask in {type_name} where the table "
                  f"lists ReduceSum and Mul for {type_name} (10.x)" if op == "CumSum" else "")
        return (f"lower-unsupported {RUN_BY_TRT} computes {op} in "
                "FP32 where that is exact (a ConstantOfShape value FP32 holds; sums and "
                "extrema of a BOOL tensor cast to an integer type, or of rows of a 0/1 "
                f"table; NonZero){masked}; elsewhere: {fix}")
    return fix


def _float_fill_fix(type_name: str, target: TrtTarget) -> str:
    """An FP16/BF16 ConstantOfShape: its only input is the shape, the type is its `value`,
    so there is nothing to Cast before it; lower-unsupported fills in FP32 and casts after
    (`graphfix.plugins.retype`) where the target's Cast row lists the type."""
    refused = float_fill_refusal(target, type_name)
    if refused:
        return (f"{refused}: export this fill (and what reads it) in FP32, or target a "
                f"TensorRT version that lists ConstantOfShape for {type_name}")
    return (f"lower-unsupported {RUN_BY_TRT} fills in FP32 and "
            f"Casts the result to {type_name}, exactly (FP32 holds every {type_name} value)")


def _cast_fix(type_name: str, op: str, listed: str) -> str:
    if type_name == "INT64" and "INT32" in listed.split(", "):
        return "int64-to-int32 (where the values fit), or Cast to INT32 before this node"
    if type_name.startswith("INT64"):  # TensorRT < 9 casts to INT32 itself: not listed either
        return (f"Cast the tensor to a type the table lists for {op} before this node "
                "(int64-to-int32 would not help: INT32 is not listed either)")
    if type_name in ("INT8", "UINT8"):
        return "quantize through QuantizeLinear/DequantizeLinear (graphfix calibrate)"
    return f"Cast the {type_name} tensor to a listed type before this node"


def opset_range(view: ModelView, target: TrtTarget) -> Iterator[Finding]:
    """`opset-out-of-range` (error): the model's ai.onnx opset against the parser's range."""
    bounds = target.opset_range
    if bounds is None or not view.opset:
        return
    low, high = bounds
    if low <= view.opset <= high:
        return
    wanted = min(max(view.opset, low), high)
    yield Finding(
        "opset-out-of-range", ERROR,
        f"the model uses ONNX opset {view.opset}; the TensorRT {target.version} parser "
        f"supports opsets {low} to {high}",
        fact=f"matrix {target.version}: opset range {low}-{high}",
        fix=f"opset{{version={wanted}}}",
    )


def custom_domains(view: ModelView, target: TrtTarget) -> Iterator[Finding]:
    """`domain-contrib` (error) for onnxruntime/ONNX-ML ops; plugin ops are left to
    rules_plugins. One finding per (domain, op)."""
    grouped: dict[tuple[str, str], list[NodeRef]] = {}
    for ref in view.nodes:
        if ref.domain.startswith("com.microsoft") or ref.domain == "ai.onnx.ml":
            grouped.setdefault((ref.domain, ref.op), []).append(ref)
    for (domain, op), refs in grouped.items():
        if domain == "com.microsoft" and op in ("Attention", "MultiHeadAttention"):
            fix = (f"unfuse-contrib, where the {op} has no past/present state or rotary "
                   "embedding and an unpacked, 3-D input (its notes name the nodes it "
                   "leaves)")
        elif domain == _NCHWC or (domain == "com.microsoft" and op in MS_REWRITES):
            fix = "unfuse-contrib"
        elif domain == "ai.onnx.ml":
            fix = "move this classical-ML stage out of the TensorRT model (pre/post-processing)"
        elif op in QUANTIZER_OPS or (domain == "com.microsoft" and op in _MS_QDQ):
            fix = QUANTIZED_FIX
        else:
            fix = ("re-export without onnxruntime's offline optimizations "
                   "(graph_optimization_level below EXTENDED), or implement a TensorRT plugin")
        yield Finding(
            "domain-nonstandard", ERROR,
            f"{domain}::{op} is an onnxruntime/ONNX-ML op outside the standard domain; "
            "TensorRT's ONNX parser only knows ai.onnx ops and registered plugins",
            nodes=tuple(r.label for r in refs), op=f"{domain}::{op}",
            fact=f"matrix {target.version}: lists ai.onnx operators only",
            fix=fix,
        )


def inference_failed(view: ModelView, target: TrtTarget) -> Iterator[Finding]:
    """`shape-inference-failed` (warn) when ONNX shape inference failed: dtype and shape
    rules then see less. ONNX's lenient inference fails only on models it cannot read,
    which no pass repairs, so the fix names none."""
    if view.inference_error:
        yield Finding(
            "shape-inference-failed", WARN,
            "ONNX shape inference failed on this model, so dtype and shape checks are partial",
            fact=view.inference_error,
            fix="onnx.checker.check_model(model, full_check=True) names what is invalid; fix "
                "that in the exporter",
        )
