"""The run's output check across a TopK that chose among values tied to within rounding
(`runtime.pinning`): judged with the original's choice, else not judged after it."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphfix.runtime import outputs
from graphfix.runtime.session import run_model

# c[0] < c[1], but (c * a) * b rounds both to the same float32 while c * (a * b) keeps
# c[1] above: the original's TopK keeps index 0 (the lower of tied values), a rewrite
# that folds a * b keeps index 1, with values equal to the last bit
C = np.array([0.7000001, 0.70000017, 0.1], np.float32)
A, B = np.float32(1.1), np.float32(3.3)
ROWS = np.arange(12, dtype=np.float32).reshape(3, 4) * 10


def _model(folded: bool, k: int = 1, extra: tuple[str, ...] = (), scale: float = 1.0,
           bug: float = 0.0) -> onnx.ModelProto:
    """x -> z = x + v + bug (not after the TopK's indices); s = c*a*b (or c*(a*b)*scale
    when `folded`), with c read through the input; v, i = TopK(s, k); y = Gather(rows,
    i); `extra` outputs: "w" = ArgMax(Gather(s, i)) (after the TopK), "u" = ArgMax(s)
    (not after it), "n" =
    NonZero(s >= cut) (a threshold at the tied values), "m" =
    Sign(Gather(s, i) - cut) as float (after the TopK; Sign is no selection, so nothing
    witnesses its flip)."""
    inits = [numpy_helper.from_array(C, "c"), numpy_helper.from_array(ROWS, "rows"),
             numpy_helper.from_array(np.array([k], np.int64), "k"),
             numpy_helper.from_array(np.array([bug], np.float32), "bug"),
             numpy_helper.from_array(np.array([C[0] * A * B], np.float32), "cut")]
    # cx = c + x * 0: c, but computed from the input (a selection of constants alone
    # is the same in any rewrite, so the check does not watch it)
    inits.append(numpy_helper.from_array(np.zeros(1, np.float32), "zero"))
    nodes = [helper.make_node("Mul", ["x", "zero"], ["x0"]),
             helper.make_node("Add", ["c", "x0"], ["cx"])]
    if folded:
        inits.append(numpy_helper.from_array(np.array([A * B * np.float32(scale)]), "ab"))
        nodes += [helper.make_node("Mul", ["cx", "ab"], ["s"])]
    else:
        inits += [numpy_helper.from_array(np.array([A]), "a"),
                  numpy_helper.from_array(np.array([B]), "b")]
        nodes += [helper.make_node("Mul", ["cx", "a"], ["ca"]),
                  helper.make_node("Mul", ["ca", "b"], ["s"])]
    nodes += [helper.make_node("TopK", ["s", "k"], ["v", "i"], name="topk"),
              helper.make_node("Gather", ["rows", "i"], ["y"]),
              helper.make_node("Add", ["x", "v"], ["xv"]),
              helper.make_node("Add", ["xv", "bug"], ["z"])]
    if "w" in extra:
        nodes += [helper.make_node("Gather", ["s", "i"], ["si"]),
                  helper.make_node("ArgMax", ["si"], ["w"], keepdims=0)]
    if "u" in extra:
        nodes.append(helper.make_node("ArgMax", ["s"], ["u"], keepdims=0))
    if "n" in extra:
        nodes += [helper.make_node("GreaterOrEqual", ["s", "cut"], ["g"]),
                  helper.make_node("NonZero", ["g"], ["n"])]
    if "m" in extra:
        nodes += [helper.make_node("Gather", ["s", "i"], ["sm"]),
                  helper.make_node("Sub", ["sm", "cut"], ["d"]),
                  helper.make_node("Sign", ["d"], ["m"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [k, 4]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [k])]
    outs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [k]) if n == "m" else
             helper.make_tensor_value_info(n, TensorProto.INT64, [1, None] if n == "n" else [])
             for n in extra]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1])], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _check(model: onnx.ModelProto) -> outputs.OutputCheck:
    return outputs.OutputCheck.prepare(model, {"x": (1,)})


def test_the_fixture_flips_the_choice_and_only_the_choice():
    feeds = {"x": np.zeros(1, np.float32)}
    before = run_model(_model(False), feeds, extra_outputs=["i"])
    after = run_model(_model(True), feeds, extra_outputs=["i"])
    assert before["i"].tolist() == [0] and after["i"].tolist() == [1]
    assert before["z"].tobytes() == after["z"].tobytes()  # the tied values: equal bits
    assert not np.allclose(before["y"], after["y"])  # a whole other row


def test_a_flipped_choice_is_judged_with_the_original_choice():
    check = _check(_model(False))
    outcome = check.verify(_model(True))
    assert outcome.ok and outcome.pinned == ["TopK 'topk'"]
    assert "chose among values tied to within rounding" in outcome.describe()
    assert check.unjudged == {}  # everything was judged


def test_a_choice_that_is_an_output_is_not_judged_and_what_follows_it_is():
    """w picks between the two tied values again (ArgMax, its input witnessed): both
    choices are pinned; w itself, a choice, is not judged; y and z are, and pass."""
    check = _check(_model(False, k=2, extra=("w",)))
    outcome = check.verify(_model(True, k=2, extra=("w",)))
    assert outcome.ok and outcome.pinned == ["TopK 'topk'", "ArgMax 'w'"]
    assert set(check.unjudged) == {"w"}
    assert {d.name for d in outcome.diffs if not d.not_compared} == {"y", "z"}


def test_a_threshold_among_the_tied_values_is_pinned_too():
    """s >= cut flips with the tie (its inputs agree): pinned with the TopK, the NonZero
    after it is judged, and agrees."""
    check = _check(_model(False, extra=("n",)))
    outcome = check.verify(_model(True, extra=("n",)))
    assert outcome.ok and outcome.pinned == ["TopK 'topk'", "GreaterOrEqual 'g'"]
    assert check.unjudged == {}


def test_what_still_differs_after_the_pinned_choices_is_not_judged_on_this_sample():
    """m = Sign(Gather(s, i) - cut) flips at the tie even with the TopK pinned (Sign is no
    selection): m, after the TopK's indices, is not judged; y and z still are."""
    check = _check(_model(False, extra=("m",)))
    outcome = check.verify(_model(True, extra=("m",)))
    assert outcome.ok and outcome.pinned == ["TopK 'topk'"]
    assert list(check.unjudged) == ["m"]
    assert "TopK 'topk' chose among values tied" in check.unjudged["m"]
    assert {d.name for d in outcome.diffs if not d.not_compared} == {"y", "z"}


def test_a_flip_elsewhere_still_fails():
    """z, outside every choice, differs by a bug: the ties are pinned, z still fails."""
    check = _check(_model(False, extra=("u",)))
    outcome = check.verify(_model(True, extra=("u",), bug=0.5))
    assert not outcome.ok
    assert [d.name for d in outcome.diffs if not d.ok] == ["z"]


def test_a_topk_whose_values_differ_is_not_a_tie():
    check = _check(_model(False))
    outcome = check.verify(_model(True, scale=1.01))  # a broken rewrite before the TopK
    assert not outcome.ok and not outcome.pinned and check.unjudged == {}
    assert "z" in {d.name for d in outcome.diffs if not d.ok}


def test_the_same_choice_costs_no_second_run(monkeypatch):
    """A rewrite whose choices are the original's is judged from its one run."""
    check = _check(_model(False))
    runs = []
    real = outputs.run_checkable
    monkeypatch.setattr(outputs, "run_checkable",
                        lambda *a, **k: runs.append(k.get("extra_outputs")) or real(*a, **k))
    assert check.verify(_model(False)).ok
    assert len(runs) == 1 and {"s", "v", "i"} <= set(runs[0])


def test_extra_outputs_leave_the_model_as_it_was():
    model = _model(False)
    before = model.SerializeToString()
    got = run_model(model, {"x": np.zeros(1, np.float32)}, extra_outputs=["ca", "y", "i"])
    assert set(got) == {"y", "z", "ca", "i"}
    assert model.SerializeToString() == before


def test_selections_of_shapes_and_constants_are_not_watched():
    """Shape arithmetic (a Cast of a Shape, an Equal of a constant) is the same in any
    rewrite: only selections of computed values are witnessed, also after one (k)."""
    from onnx import parser

    from graphfix.runtime.pinning import selections

    model = parser.parse_model('<ir_version: 8, opset_import: ["" : 17]>' + """
    g (float[3,2] x) => (bool[2] e, bool[3,2] g) <int64[2] two = {3, 2}> {
        s = Shape(x)
        f = Cast <to = 1> (s)
        e = Equal(s, two)
        h = Cast <to = 7> (f)
        g = Greater(x, f)
        k = Equal(s, two)
    }""")
    onnx.checker.check_model(model, full_check=True)
    assert [s.label for s in selections(model)] == ["Greater 'g'"]


def test_a_pinned_run_computes_only_what_follows_the_selections(monkeypatch):
    """What precedes the TopK is fed from the first run (the same inputs, the same
    kernels): the pinned runs hold none of the Muls before it, s (read after the TopK)
    is fed, and the verdict is the one a whole run gives."""
    from graphfix.runtime import pinning

    models = []
    real = outputs.run_checkable

    def run(m, *a, **k):
        if not k.get("basic"):  # the floor's (optimized) run aside
            models.append(m)
        return real(m, *a, **k)

    monkeypatch.setattr(outputs, "run_checkable", run)
    check = _check(_model(False, k=2, extra=("w",)))
    del models[:]  # the original's run
    outcome = check.verify(_model(True, k=2, extra=("w",)))
    assert outcome.ok and outcome.pinned == ["TopK 'topk'", "ArgMax 'w'"]
    assert set(check.unjudged) == {"w"}
    first, *again = models
    assert len(again) == 2 and "Mul" in {n.op_type for n in first.graph.node}
    for model in again:
        assert {n.op_type for n in model.graph.node} <= {"Gather", "Add", "ArgMax"}
        assert {"s", "v", "i"} <= {i.name for i in model.graph.input}
    # cut out of the model, the same verdict as the whole pinned model gives
    monkeypatch.setattr(pinning, "can_cut", lambda *a: False)
    whole = _check(_model(False, k=2, extra=("w",))).verify(_model(True, k=2, extra=("w",)))
    assert [(d.name, d.ok) for d in whole.diffs] == [(d.name, d.ok) for d in outcome.diffs]
    assert whole.pinned == outcome.pinned


def test_after_the_selections_and_their_boundary():
    from graphfix.runtime.pinning import after, selections

    model = _model(False, extra=("w", "u"))
    follows = after(model, selections(model))
    ops = [model.graph.node[i].output[0] for i in sorted(follows.nodes)]
    assert ops == ["y", "xv", "z", "si", "w"]  # u reads s only: before every selection
    # the TopK's own outputs too: fed from the first run where the TopK is not pinned
    assert follows.boundary == ("i", "s", "v")
