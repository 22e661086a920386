import onnx
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, parse

from graphfix.errors import GraphfixError
from graphfix.passes.base import PassContext
from graphfix.passes.fix_shapes import FixShapes

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'
MODEL = HEADER + """
g (float[N,3,H,W] x) => (float[N,3,H,W] y) {
    r = Relu(x)
    y = Neg(r)
}"""


def dims(vi):
    return [d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in vi.type.tensor_type.shape.dim]


def test_fixes_inputs_from_options_and_reinfers_outputs():
    model = parse(MODEL)
    pass_ = FixShapes(FixShapes.parse_options([("x", "2x3x8x8")]))
    out, result = apply(pass_, model)
    assert dims(out.graph.input[0]) == [2, 3, 8, 8]
    assert dims(out.graph.output[0]) == [2, 3, 8, 8]
    assert result.counts["fixed input shapes"] == 1
    onnx.shape_inference.infer_shapes(out, strict_mode=True)
    feeds = feeds_for(out)
    assert_same_outputs(model, out, feeds, rtol=0, atol=0)
    assert_idempotent(FixShapes(), out)


def test_uses_context_shapes_without_options():
    out, _ = apply(FixShapes(), parse(MODEL), PassContext(input_shapes={"x": (1, 3, 4, 5)}))
    assert dims(out.graph.input[0]) == [1, 3, 4, 5]
    assert dims(out.graph.output[0]) == [1, 3, 4, 5]


def test_unresolvable_input_is_a_user_error():
    with pytest.raises(GraphfixError, match="fix-shapes"):
        apply(FixShapes(), parse(MODEL))


def test_unknown_input_name_is_a_user_error():
    pass_ = FixShapes(FixShapes.parse_options([("nope", "1x3x4x4")]))
    with pytest.raises(GraphfixError, match="not an input"):
        apply(pass_, parse(MODEL))


def test_shape_that_contradicts_static_dims_is_a_user_error():
    pass_ = FixShapes(FixShapes.parse_options([("x", "1x4x8x8")]))
    with pytest.raises(GraphfixError, match="does not fit"):
        apply(pass_, parse(MODEL))


def test_bad_shape_text_is_a_user_error():
    with pytest.raises(GraphfixError, match="input shape"):
        FixShapes.parse_options([("x", "1x3xHx8")])
