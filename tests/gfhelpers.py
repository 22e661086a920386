"""Test helpers: build models from ONNX text, apply a pass the way the manager does,
compare numerics in onnxruntime (graph optimizations off, seeded inputs)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser

from graphfix.graph import fingerprint, to_graph, to_model
from graphfix.passes.base import Pass, PassContext, PassResult
from graphfix.runtime.feeds import graph_inputs, random_feeds, resolve_shapes
from graphfix.runtime.session import run_model


def parse(text: str) -> onnx.ModelProto:
    """A model from ONNX text; checked strictly."""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    return model


def unrunnable_model() -> onnx.ModelProto:
    """x -> Identity -> acme.Frobnicate -> y: onnxruntime cannot run it and graphfix has
    no reference form for it, so the output check is skipped."""
    return onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17, "acme" : 1]>' + """
        g (float[2,3] x) => (float[2,3] y) {
            a = Identity(x)
            y = acme.Frobnicate(a)
        }""")


def reshape_chain(*middle: str) -> onnx.ModelProto:
    """x[1,1,1] -> Reshape to [N, -1] (target computed from Shape) -> `middle` ops (ONNX
    text lines reading `r`, the last writing `m`; none: m is r) -> the same Reshape of m
    -> y. The second target reads m's shape, which no value_info records."""
    lines = list(middle) or ["m = Identity (r)"]
    body = "\n".join(f"  {line}" for line in lines)
    return parse(f"""
        <ir_version: 6, opset_import: ["" : 11]>
        chain (float[1,1,1] x) => (float[1,1] y)
        <int64[1] zero = {{0}}, int64[1] one = {{1}}, int64[1] rest = {{-1}}>
        {{
          s1 = Shape (x)
          l1 = Slice (s1, zero, one)
          t1 = Concat <axis = 0> (l1, rest)
          r = Reshape (x, t1)
        {body}
          s2 = Shape (m)
          l2 = Slice (s2, zero, one)
          t2 = Concat <axis = 0> (l2, rest)
          y = Reshape (m, t2)
        }}
    """)


def conv_bn_model() -> onnx.ModelProto:
    """Conv (a 64x32x3x3 weight: 72 KiB, deferred at load and spilled once rewritten) +
    BatchNormalization, on x[1,32,8,8]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 32, 3, 3)).astype(np.float32),
                                     "w")]
    for name, low in (("scale", 0.5), ("bias", -1), ("mean", -1), ("var", 0.5)):
        inits.append(numpy_helper.from_array(rng.uniform(low, 2, 64).astype(np.float32), name))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def apply(pass_: Pass, model: onnx.ModelProto, ctx: PassContext | None = None):
    """Run one pass as the manager does (cleanup + toposort after), check the result
    with onnx.checker, and return (new model, PassResult)."""
    graph = to_graph(model)
    result = pass_.run(graph, ctx or PassContext())
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    out = to_model(graph, model)
    onnx.checker.check_model(out, full_check=True)
    return out, result


def assert_idempotent(pass_: Pass, model: onnx.ModelProto, ctx: PassContext | None = None):
    """A second run changes nothing and says so."""
    graph = to_graph(model)
    before = fingerprint(graph)
    result: PassResult = pass_.run(graph, ctx or PassContext())
    assert not result.changed, result.counts
    assert fingerprint(graph) == before
    assert result.notes, "a pass that does nothing must say why"


def feeds_for(model: onnx.ModelProto, seed: int = 0, **shapes) -> dict[str, np.ndarray]:
    inputs = graph_inputs(model)
    return random_feeds(inputs, resolve_shapes(inputs, shapes), seed)


def assert_same_outputs(a, b, feeds, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    ra, rb = run_model(a, feeds), run_model(b, feeds)
    assert list(ra) == list(rb)
    for name in ra:
        np.testing.assert_allclose(rb[name], ra[name], rtol=rtol, atol=atol, err_msg=name)


def build_model(nodes, inputs, outputs, inits, checked=True, value_info=()) -> onnx.ModelProto:
    """An opset-17 model from onnx.helper parts. With `checked` (the default), output shapes
    are inferred and the model must pass the full checker; a few skip cases build models
    onnx rightly rejects, to reach a reason."""
    from onnx import helper

    graph = helper.make_graph(nodes, "test", inputs, outputs, inits, value_info=value_info)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if checked:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # output shapes
        del model.graph.value_info[:]
        onnx.checker.check_model(model, full_check=True)
    return model


def output_types(model: onnx.ModelProto) -> list[tuple[str, int]]:
    return [(o.name, o.type.tensor_type.elem_type) for o in model.graph.output]


def assert_rewrites(pass_: Pass, model, ops_after, counts, feed_sets=None, rtol=1e-5, atol=1e-6):
    """The pass changes the model into exactly `ops_after`, counts exactly `counts`, skips
    nothing, keeps output names and types and the numbers, and a second run is a no-op."""
    out, result = apply(pass_, model)  # also runs onnx.checker on the result
    assert result.changed
    assert dict(result.counts) == counts
    assert result.notes == []
    assert ops(out) == ops_after
    assert output_types(out) == output_types(model)
    for feeds in feed_sets or [feeds_for(model)]:
        assert_same_outputs(model, out, feeds, rtol=rtol, atol=atol)
    assert_idempotent(pass_, out)
    return out


def assert_skips(pass_: Pass, model, subject: str, reason: str) -> None:
    """The pass leaves the graph exactly as it was, with one note: `subject: reason`."""
    graph = to_graph(model)
    snapshot = fingerprint(graph)
    result = pass_.run(graph, PassContext())
    assert not result.changed
    assert not result.counts
    assert [(n.subject, n.reason) for n in result.notes] == [(subject, reason)]
    assert fingerprint(graph) == snapshot


# ----------------------------------------------------------------------------- model parts


def init(name: str, array) -> onnx.TensorProto:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(array), name)


def value(name: str, shape, elem: int = onnx.TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return onnx.helper.make_tensor_value_info(name, elem, shape)


def seeded(shape, dtype=np.float32, seed: int = 0) -> np.ndarray:
    """Seeded N(0, 0.3^2) values: weights and constants of test models."""
    return (np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(dtype)


def conv_branch(name: str, op: str, constant: np.ndarray, relu: bool) -> onnx.GraphProto:
    """An If branch reading the outer `x` [1,3,8,8]: Conv(x, W[4,3,3,3]) -> op(., constant)
    [-> Relu], output [1,4,6,6]; tensor names prefixed by `name`."""
    inits = [init(f"{name}_W", seeded([4, 3, 3, 3], seed=len(name))), init(f"{name}_k", constant)]
    nodes = [onnx.helper.make_node("Conv", ["x", f"{name}_W"], [f"{name}_c"], name=f"{name}_conv"),
             onnx.helper.make_node(op, [f"{name}_c", f"{name}_k"], [f"{name}_e"],
                                   name=f"{name}_{op.lower()}")]
    out = f"{name}_e"
    if relu:
        nodes.append(onnx.helper.make_node("Relu", [out], [f"{name}_y"], name=f"{name}_relu"))
        out = f"{name}_y"
    return onnx.helper.make_graph(nodes, name, [], [value(out, [1, 4, 6, 6])], inits)



def if_of_conv_branches(op: str, constant: np.ndarray) -> tuple[onnx.ModelProto, list[dict]]:
    """If 'if'(cond) over x [1,3,8,8]: then = Conv -> op(constant) -> Relu, else = Conv ->
    op(constant) (`conv_branch`); with feeds taking each branch once."""
    node = onnx.helper.make_node("If", ["cond"], ["y"], name="if",
                                 then_branch=conv_branch("then", op, constant, True),
                                 else_branch=conv_branch("else", op, constant, False))
    inputs = [value("x", [1, 3, 8, 8]), value("cond", [], onnx.TensorProto.BOOL)]
    model = build_model([node], inputs, [value("y", [1, 4, 6, 6])], [])
    x = np.random.default_rng(1).standard_normal([1, 3, 8, 8]).astype(np.float32)
    return model, [{"x": x, "cond": np.array(c)} for c in (True, False)]


def conv_skip_case(op: str, other: str, constant: np.ndarray, case: str) -> onnx.ModelProto:
    """x[1,3,8,8] -> Conv 'conv'(W) -> c -> op 'name'(c, `other`) -> y, changed by `case`:
    c also read by a Relu; c also a graph output; `other` a graph input; W a graph input;
    the Conv with a bias 'b' that is a graph input."""
    inits = [init("W", seeded([4, 3, 3, 3])), init(other, constant)]
    inputs, outputs = [value("x", [1, 3, 8, 8])], [value("y", None)]
    nodes = [onnx.helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             onnx.helper.make_node(op, ["c", other], ["y"], name=op.lower())]
    if case == "second-reader":
        nodes.append(onnx.helper.make_node("Relu", ["c"], ["r"], name="relu"))
        outputs.append(value("r", None))
    elif case == "conv-output-is-graph-output":
        outputs.append(value("c", None))
    elif case == "other-input":
        inits = inits[:1]
        inputs.append(value(other, list(constant.shape)))
    elif case == "weights-input":
        inits = inits[1:]
        inputs.append(value("W", [4, 3, 3, 3]))
    elif case == "conv-bias-input":
        nodes[0] = onnx.helper.make_node("Conv", ["x", "W", "b"], ["c"], name="conv")
        inputs.append(value("b", [4]))
    else:
        raise ValueError(case)
    return build_model(nodes, inputs, outputs, inits)


def ort_optimized(model: onnx.ModelProto, path, level: str = "basic") -> onnx.ModelProto:
    """The model as onnxruntime's own optimizer saves it (`optimized_model_filepath`) at
    `level` "basic", "extended" or "all" (the last is this CPU's NCHWc layout)."""
    import onnxruntime as ort

    levels = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    so = ort.SessionOptions()
    so.graph_optimization_level = levels[level]
    so.optimized_model_filepath = str(path)
    so.log_severity_level = 4
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return onnx.load(str(path))


def spy(monkeypatch, owner, name: str, record) -> list:
    """Replace `owner.name` (a function or method) by one that appends `record(*args,
    **kwargs)` to the returned list, then calls the original."""
    original = getattr(owner, name)
    seen: list = []

    def spied(*args, **kwargs):
        seen.append(record(*args, **kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, spied)
    return seen


def contrib_gelu_mlp() -> onnx.ModelProto:
    """x [n, 8] -> MatMul 'fc1' -> com.microsoft Gelu 'gelu' (g: no type for ONNX's
    inference) -> MatMul 'fc2' -> y [n, 4]; seeded weights w1, w2."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Gelu", ["h"], ["g"], name="gelu", domain="com.microsoft"),
             helper.make_node("MatMul", ["g", "w2"], ["y"], name="fc2")]
    model = build_model(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w1"),
         numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "w2")],
        checked=False)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model
