"""graph.shapes.infer_shapes: ONNX's inference, then onnxruntime's symbolic inference for
the dims ONNX leaves unknown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gfhelpers import parse

from graphfix.graph import to_graph
from graphfix.graph.shapes import infer_shapes, reshape_dims, symbolic_shapes

# RAFT-like: a Reshape target computed with arithmetic on a dim (width / 2)
MODEL = '<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[N,16] x) => (float[?,?,?] y, int64[3] z)
  <int64[1] b = {1}, int64[1] e = {2}, int64[1] two = {2}, int64[1] m1 = {-1}> {
    s = Shape(x)
    w = Slice(s, b, e)
    h = Div(w, two)
    t = Concat<axis=0>(m1, h, two)
    y = Reshape(x, t)
    z = Shape(y)
}"""


def test_arithmetic_on_dims_is_resolved_and_the_batch_keeps_its_name():
    graph = to_graph(parse(MODEL))
    infer_shapes(graph, symbolic=True)
    assert graph.tensors()["y"].shape == ["N", 8, 2]  # ONNX alone: [unk, unk, 2]


def test_a_model_symbolic_inference_fails_on_gives_none():
    model = parse(MODEL)
    del model.graph.node[0]  # 's' now comes from nowhere
    assert symbolic_shapes(model) is None


def test_an_incomplete_inference_writes_no_file(tmp_path, monkeypatch):
    # onnxruntime's entry point saves sym_shape_infer_temp.onnx into the current directory
    # when a shape stays unknown (here: the output of an op it does not know)
    monkeypatch.chdir(tmp_path)
    model = parse('<ir_version: 8, opset_import: ["" : 17, "custom" : 1]>' + """
    g (float[N,16] x) => (float[N,16] y) { c = custom.Unknown(x) y = Relu(c) }""")
    inferred = symbolic_shapes(model)
    assert list(tmp_path.iterdir()) == []
    assert inferred is None or inferred.graph.node[0].op_type == "Unknown"


def test_graphs_with_control_flow_keep_onnx_shapes_alone(monkeypatch):
    # onnxruntime's inference gives an If output one branch's shape; silero's VAD has Ifs
    # whose branches differ in rank, and folding on such shapes broke its LSTM
    from graphfix.graph import shapes

    def called(model):
        raise AssertionError("symbolic inference on a graph with an If")

    monkeypatch.setattr(shapes, "symbolic_shapes", called)
    graph = to_graph(parse('<ir_version: 8, opset_import: ["" : 17]>' + """
    g (bool c, float[N,16] x) => (float[?,?] y) {
        y = If(c) < then_branch = t () => (float[?,?] a) { a = Relu(x) },
                    else_branch = e () => (float[?,?] b) { b = Neg(x) } >
    }"""))
    infer_shapes(graph, symbolic=True)  # would raise if it asked onnxruntime's inference


def test_shapes_of_named_dims_only_skip_the_symbolic_inference(monkeypatch):
    # it costs a second and sympy's memory; a Shape of [N, 16] gains nothing from it
    from graphfix.graph import shapes

    def called(model):
        raise AssertionError("symbolic inference without a dim to find")

    monkeypatch.setattr(shapes, "symbolic_shapes", called)
    graph = to_graph(parse('<ir_version: 8, opset_import: ["" : 17]>' + """
    g (float[N,16] x) => (int64[2] s) { r = Relu(x) s = Shape(r) }"""))
    infer_shapes(graph, symbolic=True)
    assert graph.tensors()["r"].shape == ["N", 16]


# swin-like: the batch folded into a computed dim by Reshape(-1); no inference can find
# that dim static, so the symbolic run (sympy's import, a walk over the graph) is skipped
WINDOWS = '<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[N,8] x) => (int64[2] z) <int64[2] t = {-1, 4}> {
    y = Reshape(x, t)
    r = Relu(y)
    z = Shape(r)
}"""


# the batch and back: Reshape(x, [N, -1]); ONNX cannot cancel N to find the 16
BACK = '<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[N,16] x) => (int64[1] z)
  <int64[1] zero = {0}, int64[1] m1 = {-1}, int64[1] one = {1}> {
    s = Shape(x)
    n = Gather<axis=0>(s, zero)
    t = Concat<axis=0>(n, m1)
    y = Reshape(x, t)
    r = Relu(y)
    s2 = Shape(r)
    z = Gather<axis=0>(s2, one)
}"""


def test_a_dim_that_grows_with_the_batch_cannot_be_static():
    from graphfix.graph.shapes import reads_unnamed_dims, unnamed_dims_may_be_static

    graph = to_graph(parse(WINDOWS))
    infer_shapes(graph)
    assert reads_unnamed_dims(graph)  # ONNX alone: [unk, 4]
    assert not unnamed_dims_may_be_static(graph, {"x": (1, 8)})


def test_a_dim_computed_by_arithmetic_from_static_dims_may_be_static():
    from graphfix.graph.shapes import unnamed_dims_may_be_static

    graph = to_graph(parse(BACK))
    infer_shapes(graph)
    n, dim = graph.tensors()["r"].shape
    assert n == "N" and not isinstance(dim, int)  # ONNX alone: a fresh name
    assert unnamed_dims_may_be_static(graph, {"x": (1, 16)})


def test_fold_constants_skips_the_symbolic_run_where_it_cannot_help(monkeypatch):
    from graphfix.graph import shapes
    from graphfix.passes.base import PassContext
    from graphfix.passes.fold_constants import FoldConstants

    def called(model):
        raise AssertionError("symbolic inference where every unnamed dim varies")

    monkeypatch.setattr(shapes, "symbolic_shapes", called)
    graph = to_graph(parse(WINDOWS))
    result = FoldConstants().run(graph, PassContext(input_shapes={"x": (1, 8)}))
    assert not result.changed


def test_fold_constants_asks_the_symbolic_run_where_a_dim_may_be_static(monkeypatch):
    from graphfix.graph import shapes
    from graphfix.passes.base import PassContext
    from graphfix.passes.fold_constants import FoldConstants

    asked = []
    real = shapes.symbolic_shapes
    monkeypatch.setattr(shapes, "symbolic_shapes", lambda m: asked.append(1) or real(m))
    model = parse(BACK)
    graph = to_graph(model)
    result = FoldConstants().run(graph, PassContext(input_shapes={"x": (1, 16)}))
    assert asked == [1]
    assert result.changed
    graph.cleanup()
    assert graph.nodes == []  # z = [16] whatever N, so nothing is left to compute
    assert graph.outputs[0].values.tolist() == [16]


# YOLO-like: an anchor grid over the input's width, Range(0, W); ONNX's data propagation
# has no Range, so its inference leaves the grid's length unknown even at concrete sizes
def _grid(axis: int, end: str = "wf") -> str:
    return '<ir_version: 8, opset_import: ["" : 17]>' + f"""
g (float[N,3,H,W] x) => (int64[2] z)
  <int64 axis = {{{axis}}}, float zero = {{0.0}}, float one = {{1.0}}, float half = {{0.5}},
   int64[1] ax0 = {{0}}> {{
    s = Shape(x)
    w = Gather<axis=0>(s, axis)
    wf = Cast<to=1>(w)
    mf = ReduceMax<keepdims=0>(x)
    r = Range(zero, {end}, one)
    a = Add(r, half)
    u = Unsqueeze(a, ax0)
    z = Shape(u)
}}"""


def test_a_grid_over_a_dynamic_width_cannot_be_static():
    from graphfix.graph.shapes import unnamed_dims_may_be_static

    graph = to_graph(parse(_grid(3)))
    infer_shapes(graph)
    assert not isinstance(graph.tensors()["u"].shape[1], int)  # ONNX alone: unnamed
    # computed at W = 5 and 10: 5 and 10, so it depends on W
    assert not unnamed_dims_may_be_static(graph, {"x": (1, 3, 4, 5)})


def test_a_grid_over_a_static_dim_may_be_static():
    from graphfix.graph.shapes import unnamed_dims_may_be_static

    graph = to_graph(parse(_grid(1)))  # Range(0, 3): 3 at every size
    infer_shapes(graph)
    assert not isinstance(graph.tensors()["u"].shape[1], int)
    assert unnamed_dims_may_be_static(graph, {"x": (1, 3, 4, 5)})


def test_a_grid_over_values_is_undecided():
    from graphfix.graph.shapes import unnamed_dims_may_be_static

    graph = to_graph(parse(_grid(3, end="mf")))  # Range(0, max(x)): the data decides
    infer_shapes(graph)
    assert unnamed_dims_may_be_static(graph, {"x": (1, 3, 4, 5)})


def test_a_grid_past_the_node_limit_is_undecided(monkeypatch):
    from graphfix.graph import shapes

    monkeypatch.setattr(shapes, "COMPUTED_NODES", 3)  # the grid takes 5 nodes
    graph = to_graph(parse(_grid(3)))
    infer_shapes(graph)
    assert shapes.unnamed_dims_may_be_static(graph, {"x": (1, 3, 4, 5)})


def test_fold_constants_computes_grids_instead_of_the_symbolic_run(monkeypatch):
    from graphfix.graph import shapes
    from graphfix.passes.base import PassContext
    from graphfix.passes.fold_constants import FoldConstants

    asked = []
    real = shapes.symbolic_shapes
    monkeypatch.setattr(shapes, "symbolic_shapes", lambda m: asked.append(1) or real(m))
    dynamic = to_graph(parse(_grid(3)))
    FoldConstants().run(dynamic, PassContext(input_shapes={"x": (1, 3, 4, 5)}))
    assert asked == []  # 1.9 s of sympy on a dynamic YOLOv8n, and nothing to find
    assert any(n.op == "Range" for n in dynamic.nodes)
    static = to_graph(parse(_grid(1)))  # folded before any Shape is left to ask about
    result = FoldConstants().run(static, PassContext(input_shapes={"x": (1, 3, 4, 5)}))
    assert asked == [] and result.changed
    static.cleanup()
    assert static.nodes == [] and static.outputs[0].values.tolist() == [1, 3]


def test_reshape_dims_follow_onnx_reshape():
    assert reshape_dims([2, 3, 4], [0, -1], False) == [2, 12]
    assert reshape_dims([2, 3, 4], [0, -1], True) == [0, None]  # 0 is a size; -1 unknown
    assert reshape_dims(["batch", 3, 4], [0, 12], False) == ["batch", 12]
    assert reshape_dims(["batch", 3, 4], [0, -1], False) == ["batch", None]  # not static
    assert reshape_dims([2, 3, 4], ["n", -1], False) == ["n", None]
    assert reshape_dims([2, 3, 4], [5, -1], False) == [5, None]  # 24 does not divide
    assert reshape_dims([2, 3], [0, 0, 6], False) == [2, 3, 6]
    assert reshape_dims([2, 3], [1, 0, 0], False) == [1, 3, None]  # past the input's rank
    assert reshape_dims([6], [-1, -1], False) == [None, None]
    assert reshape_dims([6], [-2, 3], False) == [None, 3]


def test_symbolic_inference_never_runs_onnxruntime_tools_package_init():
    """onnxruntime/tools/__init__.py imports torch wherever torch is installed (1.1 s and
    190 MiB of a BERT run); graphfix loads symbolic_shape_infer.py from its file."""
    code = (
        "import sys\n"
        "from gfhelpers import parse\n"
        "from test_shapes import MODEL\n"
        "from graphfix.graph import to_graph\n"
        "from graphfix.graph.shapes import infer_shapes\n"
        "graph = to_graph(parse(MODEL))\n"
        "infer_shapes(graph, symbolic=True)\n"
        "assert graph.tensors()['y'].shape == ['N', 8, 2], graph.tensors()['y'].shape\n"
        "print(sorted(m for m in sys.modules if m.startswith('onnxruntime.tools')))\n"
    )
    here = Path(__file__).resolve().parent
    paths = [str(here), str(here.parent), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True)
    assert out.stdout.strip() == "[]", out.stdout  # neither the package nor torch's helper


def test_computed_shapes_give_up_on_a_cycle_instead_of_looping():
    from onnx import TensorProto, helper

    from graphfix.graph.shapes import _computed_shapes

    nodes = [helper.make_node("Add", ["b", "one"], ["a"]),
             helper.make_node("Add", ["a", "one"], ["b"]),
             helper.make_node("Identity", ["b"], ["c"])]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(
        "c", TensorProto.INT64, None)], [helper.make_tensor("one", TensorProto.INT64, [], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert _computed_shapes(model, {}, ["c"]) == {}  # a malformed model: unknown, as before


# YOLO exported with NMS: the detections' count comes from NonZero, read by Shape
DETECTIONS = '<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[N,4] x) => (int64[1] z) <float zero = {0.0}> {
    keep = Greater(x, zero)
    where = NonZero(keep)
    picks = Transpose(where)
    kept = GatherND(x, picks)
    r = Relu(kept)
    z = Shape(r)
}"""


def test_a_count_of_data_is_never_static_so_the_symbolic_run_is_skipped(monkeypatch):
    from graphfix.graph import shapes
    from graphfix.graph.shapes import unnamed_dims_may_be_static
    from graphfix.passes.base import PassContext
    from graphfix.passes.fold_constants import FoldConstants

    graph = to_graph(parse(DETECTIONS))
    infer_shapes(graph)
    assert not isinstance(graph.tensors()["r"].shape[0], int)
    assert not unnamed_dims_may_be_static(graph, {"x": (2, 4)})

    def called(model):
        raise AssertionError("symbolic inference for a count of data")

    monkeypatch.setattr(shapes, "symbolic_shapes", called)
    FoldConstants().run(to_graph(parse(DETECTIONS)), PassContext(input_shapes={"x": (2, 4)}))
