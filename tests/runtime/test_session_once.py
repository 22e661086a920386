"""A session that runs once (the per-pass check, `run_model`) skips weight pre-packing:
it saves the session's start-up; its outputs are deterministic, so the original and a
candidate run alike compare exactly, and within float rounding of a pre-packed run's."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from graphfix import samples
from graphfix.runtime.session import make_session, run_model, session_options


def test_only_one_shot_sessions_skip_prepacking():
    key = "session.disable_prepacking"
    assert session_options(once=True).get_session_config_entry(key) == "1"
    try:
        plain = session_options().get_session_config_entry(key)
    except RuntimeError:  # onnxruntime raises for a key never set
        plain = ""
    assert plain in ("", "0")


def _matmul() -> object:
    w = np.random.default_rng(1).standard_normal((256, 192)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 192])],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_outputs_are_deterministic_and_close_to_a_prepacked_session():
    rng = np.random.default_rng(0)
    cases = [(samples.deep_resnet(blocks=3), {"input": rng.standard_normal(
        (1, 3, 16, 16)).astype(np.float32)}),
             (_matmul(), {"x": rng.standard_normal((8, 256)).astype(np.float32)})]
    for model, feeds in cases:
        once, again = run_model(model, feeds), run_model(model, feeds)
        session = make_session(model)
        names = [o.name for o in session.get_outputs()]
        for name, value in zip(names, session.run(names, feeds), strict=True):
            np.testing.assert_array_equal(once[name], again[name])
            # within float rounding of the tensor's scale (what graphfix's verdict allows)
            np.testing.assert_allclose(once[name], value, rtol=0,
                                       atol=1e-5 * float(np.abs(value).max()))


def test_outputs_kept_after_the_run_do_not_keep_its_memory():
    """onnxruntime's outputs are views of its memory arena, which lives as long as one of
    them does: run_model's own their memory, a sequence's elements too."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]),
         helper.make_node("SequenceConstruct", ["y", "x"], ["s"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    out = run_model(model, {"x": x})
    assert [type(v).__name__ for v in out.values()] == ["ndarray", "list"]
    for value in [out["y"], *out["s"]]:
        assert value.base is None and value.flags.owndata and value.flags.writeable
    np.testing.assert_array_equal(out["y"], np.maximum(x, 0))
    np.testing.assert_array_equal(out["s"][1], x)
