"""Layer-wise comparison on Conv chains: first divergence, origins, samples, renames,
merged tensors, chunking, errors and the JSON report."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from gfhelpers import build_model, feeds_for
from onnx import TensorProto, helper, numpy_helper

import graphfix.check._runs as runs
from graphfix.api import run
from graphfix.check.layerwise import SCHEMA, compare_layerwise, resolve_mode
from graphfix.check.status import TensorStatus
from graphfix.errors import GraphfixError

C = 4  # channels; every activation is 1 x 4 x 8 x 8 float32 = 1024 bytes


def chain(n: int = 6, bn: bool = False, seed: int = 0) -> onnx.ModelProto:
    """x -> n x (Conv 'conv{i}' -> c{i} [-> BatchNormalization 'bn{i}' -> b{i}]
    -> Relu 'relu{i}' -> r{i})."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i in range(1, n + 1):
        w = rng.standard_normal((C, C, 3, 3)) / np.sqrt(C * 9)
        inits.append(numpy_helper.from_array(w.astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], name=f"conv{i}",
                                      pads=[1, 1, 1, 1]))
        cur = f"c{i}"
        if bn:
            parts = {"s": rng.uniform(0.5, 1.5, C), "b": rng.standard_normal(C) * 0.1,
                     "m": rng.standard_normal(C) * 0.1, "v": rng.uniform(0.5, 1.5, C)}
            inits += [numpy_helper.from_array(v.astype(np.float32), f"bn{i}_{k}")
                      for k, v in parts.items()]
            nodes.append(helper.make_node("BatchNormalization",
                                          [cur, *(f"bn{i}_{k}" for k in parts)], [f"b{i}"],
                                          name=f"bn{i}"))
            cur = f"b{i}"
        nodes.append(helper.make_node("Relu", [cur], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 8, 8])
    return build_model(nodes, [x], [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)],
                       inits)


def copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def perturb(model: onnx.ModelProto, weight: str, delta: float = 0.05) -> onnx.ModelProto:
    """A copy with one element of initializer `weight` moved by `delta`."""
    out = copy(model)
    init = next(t for t in out.graph.initializer if t.name == weight)
    values = numpy_helper.to_array(init).copy()
    values.flat[values.size // 2] += delta
    init.CopyFrom(numpy_helper.from_array(values, weight))
    return out


def samples(model: onnx.ModelProto, n: int = 3) -> list[dict[str, np.ndarray]]:
    return [feeds_for(model, seed=s) for s in range(n)]


# ------------------------------------------------------------------ acceptance


def test_perturbed_deep_conv_is_first_divergence_and_top_origin():
    ref = chain()
    report = compare_layerwise(ref, perturb(ref, "w4"), samples(ref))
    assert report.mode == "strict"
    first = report.first_divergence
    assert (first.name, first.node, first.op) == ("c4", "Conv 'conv4'", "Conv")
    assert report.origins[0].name == "c4" and report.origins[0].node == "Conv 'conv4'"
    assert report.origins[0].input_error == 0.0
    assert [o.node for o in report.origins] == ["Conv 'conv4'"]  # downstream only inherits
    assert not report.outputs_ok
    by = {t.name: t for t in report.tensors}
    assert all(by[t].ok for t in ("x", "c1", "r1", "c2", "r2", "c3", "r3"))
    assert all(by[t].ok is False for t in ("c4", "r4", "c5", "r5", "c6", "r6"))
    assert [t.name for t in report.tensors] == ["x"] + [f"{k}{i}" for i in range(1, 7)
                                                        for k in "cr"]
    assert [t.order for t in report.tensors] == list(range(13))
    assert by["x"].node == "graph input" and by["x"].op == ""
    assert by["c4"].sqnr_db < by["c3"].sqnr_db == float("inf")


def test_fold_bn_rewrite_passes_with_merged_tensors_shown():
    ref = chain(bn=True)
    result = run(ref, passes="fold-bn")
    report = compare_layerwise(ref, result.model, samples(ref),
                               renamed=result.report.renamed, removed=result.report.removed)
    assert report.outputs_ok and report.first_divergence is None and report.origins == []
    by = {t.name: t for t in report.tensors}
    for i in range(1, 7):
        assert (by[f"c{i}"].status, by[f"c{i}"].detail) == (TensorStatus.MERGED, "fold-bn")
        assert by[f"c{i}"].describe_status() == "merged by fold-bn"
        assert by[f"c{i}"].ok is None and by[f"c{i}"].candidate is None
        assert by[f"b{i}"].status == "compared" and by[f"b{i}"].ok
        assert by[f"b{i}"].max_abs < 1e-4


def test_merged_tensor_is_looked_through_for_the_input_error():
    """In the folded model conv4 writes b4 directly (c4 is merged): a bad folded weight
    shows as b4 diverging; its input error is r3's (rounding only), so it is the origin."""
    ref = chain(bn=True)
    result = run(ref, passes="fold-bn")
    conv4 = next(n for n in result.model.graph.node if n.output[0] == "b4")
    bad = perturb(result.model, conv4.input[1])
    report = compare_layerwise(ref, bad, samples(ref), renamed=result.report.renamed,
                               removed=result.report.removed)
    assert report.first_divergence.name == "b4"
    assert report.first_divergence.node == "BatchNormalization 'bn4'"
    assert [o.name for o in report.origins] == ["b4"]
    assert 0 < report.origins[0].input_error < 1e-5 < report.origins[0].error


def test_without_removed_a_merged_tensor_is_only_in_reference():
    ref = chain(bn=True)
    result = run(ref, passes="fold-bn")
    report = compare_layerwise(ref, result.model, samples(ref))
    assert report.tensor("c1").status == "only in reference"
    assert report.outputs_ok


# ------------------------------------------------------------------ samples


def _clipped(ref: onnx.ModelProto) -> onnx.ModelProto:
    """relu3 computed as Clip(0, 3): equal to Relu while c3 stays below 3."""
    out = copy(ref)
    node = next(n for n in out.graph.node if n.name == "relu3")
    node.op_type = "Clip"
    node.input.extend(["lo", "hi"])
    out.graph.initializer.extend([numpy_helper.from_array(np.float32(0), "lo"),
                                  numpy_helper.from_array(np.float32(3), "hi")])
    return out


def test_every_sample_is_compared_and_the_worst_is_named():
    ref = chain()
    feeds = [{"x": f["x"] * 0.1} for f in samples(ref, 2)] + [{"x": samples(ref)[2]["x"] * 50}]
    cand = _clipped(ref)
    assert compare_layerwise(ref, cand, feeds[:2]).outputs_ok  # samples 0, 1 agree
    report = compare_layerwise(ref, cand, feeds)
    first = report.first_divergence
    assert (first.name, first.node, first.worst_sample) == ("r3", "Relu 'relu3'", 2)
    assert report.origins[0].node == "Relu 'relu3'" and report.origins[0].sample == 2
    assert all(t.worst_sample == 2 for t in report.tensors if t.ok is False)
    ref_r3 = np.maximum(0, _run(ref, feeds[2], "c3"))
    assert first.max_abs == pytest.approx(float((ref_r3 - np.minimum(ref_r3, 3)).max()))


def _run(model: onnx.ModelProto, feeds: dict, name: str) -> np.ndarray:
    from graphfix.runtime.expose import exposed_session

    return exposed_session(model, [name], ("cpu",)).run([name], feeds)[0]


# ------------------------------------------------------------------ names


def _renamed(ref: onnx.ModelProto) -> onnx.ModelProto:
    out = copy(ref)
    for node in out.graph.node:
        node.input[:] = ["c3_new" if i == "c3" else i for i in node.input]
        node.output[:] = ["c3_new" if o == "c3" else o for o in node.output]
    return out


def test_renamed_tensor_is_matched_through_the_map():
    ref = chain()
    cand = _renamed(ref)
    plain = compare_layerwise(ref, cand, samples(ref))
    assert plain.tensor("c3").status == "only in reference"
    report = compare_layerwise(ref, cand, samples(ref), renamed={"c3": "c3_new"})
    c3 = report.tensor("c3")
    assert (c3.status, c3.candidate, c3.ok, c3.max_abs) == ("compared", "c3_new", True, 0.0)
    assert report.outputs_ok and not report.notes


def test_renamed_names_the_reference_lacks_are_noted():
    ref = chain()
    report = compare_layerwise(ref, ref, samples(ref, 1), renamed={"nope": "x"})
    assert any("'nope'" in n for n in report.notes)


# ------------------------------------------------------------------ chunks


@pytest.mark.parametrize("budget", [1, 2048, 5000])
def test_chunked_runs_equal_the_unchunked_run(budget, monkeypatch):
    ref = chain()
    cand = perturb(ref, "w4")
    whole = compare_layerwise(ref, cand, samples(ref))
    exposed: list[list[str]] = []
    real = runs.exposed_session

    def spy(model, names, providers):
        exposed.append(list(names))
        return real(model, names, providers)

    monkeypatch.setattr(runs, "exposed_session", spy)
    chunked = compare_layerwise(ref, cand, samples(ref), memory_budget=budget)
    assert whole.chunks == 1 and chunked.chunks > 1
    assert chunked.tensors == whole.tensors
    assert chunked.origins == whole.origins
    assert chunked.first_divergence == whole.first_divergence
    per_run = max(budget // 1024, 1)  # 1024 bytes per activation; a bigger one runs alone
    assert exposed and max(len(names) for names in exposed) <= per_run
    assert {n for names in exposed for n in names} == {t.name for t in whole.tensors} - {"x"}
    if budget == 1:
        assert any("more than the memory budget" in n for n in chunked.notes)


def test_progress_counts_samples_per_run():
    ref = chain(2)
    calls = []
    compare_layerwise(ref, ref, samples(ref), memory_budget=2048,
                      progress=lambda *a: calls.append(a))
    assert calls[0] == ("run 1/2: 3 tensors", 0, 3)  # x comes from the feeds, free
    assert calls[-1] == ("run 2/2: 2 tensors", 3, 3)


# ------------------------------------------------------------------ modes, errors, json


def test_auto_mode_is_sqnr_only_for_a_qdq_candidate():
    ref = chain(1)
    qdq = copy(ref)
    scale = numpy_helper.from_array(np.float32(0.05), "s")
    zero = numpy_helper.from_array(np.int8(0), "z")
    qdq.graph.initializer.extend([scale, zero])
    qdq.graph.node.insert(0, helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]))
    qdq.graph.node.insert(0, helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]))
    qdq.graph.node[2].input[0] = "xd"
    assert resolve_mode("auto", ref, qdq) == "sqnr"
    assert resolve_mode("auto", ref, ref) == "strict"
    assert resolve_mode("auto", qdq, qdq) == "strict"
    report = compare_layerwise(ref, qdq, samples(ref, 2), sqnr_threshold=10)
    assert report.mode == "sqnr" and report.tensor("c1").quantized
    assert report.sensitivity() == [report.tensor("c1")]
    with pytest.raises(GraphfixError, match="Unknown comparison mode 'fast'"):
        resolve_mode("fast", ref, ref)


def test_no_samples_or_missing_inputs_are_user_errors():
    ref = chain(1)
    with pytest.raises(GraphfixError, match="No inputs"):
        compare_layerwise(ref, ref, [])
    with pytest.raises(GraphfixError, match="No data for input 'x'"):
        compare_layerwise(ref, ref, [{"y": np.zeros(1, np.float32)}])


def test_a_candidate_onnxruntime_cannot_run_is_a_user_error():
    ref = chain(1)
    bad = copy(ref)
    bad.graph.node[1].op_type = "NoSuchOp"
    with pytest.raises(GraphfixError, match=r"not checkable: NoSuchOp \(ai.onnx\)"):
        compare_layerwise(ref, bad, samples(ref, 1))


def test_json_report_is_strict_json():
    ref = chain()
    report = compare_layerwise(ref, perturb(ref, "w4"), samples(ref))
    data = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert data["schema"] == SCHEMA == "graphfix.check/2"
    assert data["first_divergence"]["name"] == "c4"
    assert data["origins"][0]["node"] == "Conv 'conv4'"
    assert data["tensors"][1]["sqnr_db"] == "inf"
    assert len(data["tensors"]) == 13 and data["mode"] == "strict"


def _tiny(nodes, inits, x_shape, y: str, y_shape) -> onnx.ModelProto:
    """A model of `nodes` from float input x to float output `y`, opset 17."""
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, x_shape)],
                              [helper.make_tensor_value_info(y, 1, y_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _times_40(shift: float) -> tuple[list, list]:
    """m = x * 40 + shift: the nodes and initializers (a shift is the candidate's
    rounding upstream)."""
    return ([helper.make_node("Mul", ["x", "c"], ["m0"]),
             helper.make_node("Add", ["m0", "d"], ["m"])],
            [numpy_helper.from_array(np.array(40.0, np.float32), "c"),
             numpy_helper.from_array(np.array(shift, np.float32), "d")])


def _mul_sigmoid(shift: float | None):
    """x*c -> Sigmoid, x with one large element (the Mul output's scale is 40) and the
    rest near 0, where Sigmoid is steepest; with `shift`, the candidate adds it to m."""
    nodes, inits = _times_40(shift or 0.0)
    if shift is None:
        nodes, inits = [helper.make_node("Mul", ["x", "c"], ["m"])], inits[:1]
    return _tiny(nodes + [helper.make_node("Sigmoid", ["m"], ["y"])], inits, [1, 8],
                 "y", [1, 8])


def _mul_exp(shift: float = 0.0, wrong: float = 1.0):
    """x*40 -> Exp (inputs around 4: Mask R-CNN's box decoding); the candidate adds
    `shift` to the Exp's input (rounding upstream), or scales its output by `wrong`."""
    nodes, inits = _times_40(shift)
    nodes.append(helper.make_node("Exp", ["m"], ["e" if wrong != 1.0 else "y"]))
    if wrong != 1.0:
        nodes.append(helper.make_node("Mul", ["e", "k"], ["y"]))
        inits.append(numpy_helper.from_array(np.array(wrong, np.float32), "k"))
    return _tiny(nodes, inits, [1, 8], "y", [1, 8])


def test_an_exp_may_grow_its_inputs_error_by_its_own_value():
    """m differs by 2e-5 (5e-6 of its scale, 4: within bound); Exp(m) then differs by
    max|y| * 2e-5 = 1.1e-3, twice its own scale-relative bound. That is what the input's
    error becomes through an Exp, so it agrees; an Exp computed wrongly does not."""
    feeds = [{"x": np.linspace(0.05, 0.1, 8, dtype=np.float32).reshape(1, 8)}]
    ok = compare_layerwise(_mul_exp(), _mul_exp(shift=2e-5), feeds)
    exp = ok.tensor("y")
    assert ok.passed and exp.ok
    assert exp.max_abs > 1e-5 * float(np.exp(4.0))  # over the bound of its own scale
    bad = compare_layerwise(_mul_exp(), _mul_exp(wrong=1.001), feeds)
    assert not bad.passed and bad.first_divergence.name == "y"


def _mul_slice_unsqueeze(shift: float = 0.0, wrong: float = 0.0):
    """m = x*40 (scale 40), t = its small part (scale 0.04), u = Unsqueeze(t); the
    candidate adds `shift` to m, or `wrong` to u."""
    nodes, inits = _times_40(shift)
    nodes += [helper.make_node("Slice", ["m", "starts", "ends"], ["t"]),
              helper.make_node("Unsqueeze", ["t", "axes"], ["u" if not wrong else "u0"])]
    inits += [numpy_helper.from_array(np.array([1], np.int64), "starts"),
              numpy_helper.from_array(np.array([8], np.int64), "ends"),
              numpy_helper.from_array(np.array([0], np.int64), "axes")]
    if wrong:
        nodes.append(helper.make_node("Add", ["u0", "w"], ["u"]))
        inits.append(numpy_helper.from_array(np.array(wrong, np.float32), "w"))
    return _tiny(nodes, inits, [8], "u", [1, 7])


def test_a_copy_may_carry_the_error_its_input_passed_with():
    """t passes at its operand's scale (40), though its own is 0.04; u is t unsqueezed,
    the same values and the same error, so it passes too. A copy that changes the
    values does not."""
    feeds = [{"x": np.array([1.0, 1e-3, -1e-3, 0, 1e-3, 0, 0, 0], np.float32)}]
    ok = compare_layerwise(_mul_slice_unsqueeze(), _mul_slice_unsqueeze(shift=6e-5), feeds)
    assert ok.passed and ok.tensor("t").ok and ok.tensor("u").ok
    assert ok.tensor("u").max_abs > 1e-5 * 0.04  # over the bound of its own scale
    bad = compare_layerwise(_mul_slice_unsqueeze(),
                            _mul_slice_unsqueeze(shift=6e-5, wrong=1e-3), feeds)
    assert not bad.passed and bad.first_divergence.name == "u"


def _difference(shift: float = 0.0, wrong: float = 0.0):
    """t = the small part of x*40 (+ `shift` in the candidate: t's error, admitted at the
    Mul's scale, is large for t's own), s = t - x's same part (+ `wrong`)."""
    nodes, inits = _times_40(shift)
    nodes += [helper.make_node("Slice", ["m", "starts", "ends"], ["t"]),
              helper.make_node("Slice", ["x", "starts", "ends"], ["r"]),
              helper.make_node("Sub", ["t", "r"], ["s" if not wrong else "s0"])]
    inits += [numpy_helper.from_array(np.array([1], np.int64), "starts"),
              numpy_helper.from_array(np.array([8], np.int64), "ends")]
    if wrong:
        nodes.append(helper.make_node("Add", ["s0", "w"], ["s"]))
        inits.append(numpy_helper.from_array(np.array(wrong, np.float32), "w"))
    return _tiny(nodes, inits, [8], "s", [7])


def test_a_difference_may_carry_the_sum_of_its_operands_errors():
    """s = t - r: t's error (6e-5) is far over s's own bound and its operands' (both
    about 0.04), but a difference's error is at most the sum of its operands'."""
    feeds = [{"x": np.array([1.0, 1e-3, -1e-3, 0, 1e-3, 0, 0, 0], np.float32)}]
    ok = compare_layerwise(_difference(), _difference(shift=6e-5), feeds)
    assert ok.passed and ok.tensor("s").ok
    assert ok.tensor("s").max_abs > 1e-5 * 0.04 * 10
    bad = compare_layerwise(_difference(), _difference(shift=6e-5, wrong=1e-3), feeds)
    assert not bad.passed and bad.first_divergence.name == "s"


def _product(shift: float = 0.0, wrong: float = 0.0):
    """t = the small part of x*40 (+ `shift`: an error large for t's own scale),
    r = the same part of x*1000 (exact), p = t * r (+ `wrong`)."""
    nodes, inits = _times_40(shift)
    nodes += [helper.make_node("Slice", ["m", "starts", "ends"], ["t"]),
              helper.make_node("Mul", ["x", "big"], ["xb"]),
              helper.make_node("Slice", ["xb", "starts", "ends"], ["r"]),
              helper.make_node("Mul", ["t", "r"], ["p" if not wrong else "p0"])]
    inits += [numpy_helper.from_array(np.array([1], np.int64), "starts"),
              numpy_helper.from_array(np.array([8], np.int64), "ends"),
              numpy_helper.from_array(np.array(1000.0, np.float32), "big")]
    if wrong:
        nodes.append(helper.make_node("Add", ["p0", "w"], ["p"]))
        inits.append(numpy_helper.from_array(np.array(wrong, np.float32), "w"))
    return _tiny(nodes, inits, [8], "p", [7])


def test_a_product_may_carry_what_its_operands_errors_make():
    """p = t * r: t's error (6e-5) times max|r| (1) is over p's bound at its operands'
    scale (1e-5 of 1), and within |t| dr + |r| dt + dt dr."""
    feeds = [{"x": np.array([1.0, 1e-3, -1e-3, 0, 1e-3, 0, 0, 0], np.float32)}]
    ok = compare_layerwise(_product(), _product(shift=6e-5), feeds)
    assert ok.passed and ok.tensor("p").ok
    assert ok.tensor("p").max_abs > 1e-5
    bad = compare_layerwise(_product(), _product(shift=6e-5, wrong=1e-3), feeds)
    assert not bad.passed and bad.first_divergence.name == "p"


def test_a_tensor_is_measured_against_its_operands_scale():
    """Sigmoid(m): m's error of 1.5e-6 of its scale (40) becomes 1.5e-5 of Sigmoid's own
    scale (~1) where the curve is steepest; rounding in a node is relative to its
    operands, so the Sigmoid passes at the Mul's scale. A real error at m still fails."""
    feeds = [{"x": np.array([[1.0, 0, 1e-3, -1e-3, 2e-3, 0, 0, 0]], np.float32)}]
    ok = compare_layerwise(_mul_sigmoid(None), _mul_sigmoid(6e-5), feeds)
    sigmoid = ok.tensor("y")
    assert ok.passed and sigmoid.ok
    assert sigmoid.max_abs > 1e-5  # over the bound of its own scale
    bad = compare_layerwise(_mul_sigmoid(None), _mul_sigmoid(1e-2), feeds)
    assert not bad.passed and bad.first_divergence.name == "m"


def _attention(shift: float = 0.0, wrong: float = 0.0, drop_reshape: bool = False):
    """DETR's attention in small: m = x*40 (+ `shift`: the candidate's rounding upstream),
    p = Softmax(m), q = Where(IsNaN(p), 0, p), o = MatMul(q, v), r = Reshape(o), y =
    Transpose(r) (+ `wrong`). The candidate may drop the Reshape (a no-op here), as
    eliminate-noops does (`REMOVED` says so, as its provenance would)."""
    nodes, inits = _times_40(0.0)
    inits[1] = numpy_helper.from_array(np.array([shift] + [0.0] * 7, np.float32), "d")
    nodes += [helper.make_node("Softmax", ["m"], ["p"], axis=-1),
              helper.make_node("IsNaN", ["p"], ["nan"]),
              helper.make_node("Where", ["nan", "zero", "p"], ["q"]),
              helper.make_node("Identity", ["values"], ["v"]),  # compared: its scale
              helper.make_node("MatMul", ["q", "v"], ["o"])]
    if drop_reshape:
        nodes.append(helper.make_node("Transpose", ["o"], ["y" if not wrong else "y0"]))
    else:
        nodes += [helper.make_node("Reshape", ["o", "same"], ["r"]),
                  helper.make_node("Transpose", ["r"], ["y" if not wrong else "y0"])]
    values = np.random.default_rng(0).uniform(0.5, 1.5, (8, 4)).astype(np.float32)
    inits += [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
              numpy_helper.from_array(values, "values"),
              numpy_helper.from_array(np.array([2, 4], np.int64), "same")]
    if wrong:
        nodes.append(helper.make_node("Add", ["y0", "w"], ["y"]))
        inits.append(numpy_helper.from_array(np.array(wrong, np.float32), "w"))
    return _tiny(nodes, inits, [2, 8], "y", [4, 2])


REMOVED = {"r": "eliminate-noops"}


def test_an_attentions_error_is_carried_through_where_matmul_and_a_removed_reshape():
    """The Softmax passes at its logits' scale (40); the Where selecting its
    probabilities carries their error, the MatMul K times |q| dv + |v| dq, and the
    Transpose what the Reshape the candidate removed carried: each is over its own
    scale's bound. A real error at the end still fails (graphfix check on DETR, whose
    ResNet's folded Muls round differently upstream, failed here before)."""
    near_one = [1.0, 1.001, 0.999, 1.002, 0.998, 1.0, 1.003, 0.997]
    feeds = [{"x": np.array([near_one, near_one[::-1]], np.float32)}]
    ok = compare_layerwise(_attention(), _attention(shift=3e-4, drop_reshape=True), feeds,
                           removed=REMOVED)
    assert ok.passed, ok.first_divergence
    assert all(ok.tensor(name).ok for name in ("p", "q", "o", "y"))
    q = ok.tensor("q")
    assert q.max_abs > 1e-5 * 0.2  # over the bound of its own scale (probabilities ~1/8)
    assert ok.tensor("r").status == "merged"
    bad = compare_layerwise(_attention(), _attention(shift=3e-4, wrong=1e-2,
                                                     drop_reshape=True), feeds,
                            removed=REMOVED)
    assert not bad.passed and bad.first_divergence.name == "y"


def _folded_bn(shift: float = 0.0, fold: bool = False, wrong: float = 1.0):
    """m = x*40 (+ `shift`: rounding upstream), then tf2onnx's BatchNorm form y =
    Add(Mul(Conv(m, w), s), t), or with `fold` the one Conv fuse-conv-mul and
    fuse-conv-bias make of it (weights w * s * `wrong`, bias t)."""
    rng = np.random.default_rng(0)
    w = rng.uniform(-1, 1, (3, 2, 3, 3)).astype(np.float32)
    w[:, 0] = 0  # m's large channel does not reach y: y's scale is its small one's
    s, t = np.array([2.0, 0.5, 3.0], np.float32), np.array([0.1, -0.2, 0.3], np.float32)
    nodes, inits = _times_40(shift)
    if fold:
        nodes.append(helper.make_node("Conv", ["m", "wf", "bf"], ["y"], pads=[1, 1, 1, 1]))
        inits += [numpy_helper.from_array(w * s[:, None, None, None] * wrong, "wf"),
                  numpy_helper.from_array(t, "bf")]
    else:
        nodes += [helper.make_node("Conv", ["m", "w"], ["conv"], pads=[1, 1, 1, 1]),
                  helper.make_node("Mul", ["conv", "s"], ["scaled"]),
                  helper.make_node("Add", ["scaled", "t"], ["y"])]
        inits += [numpy_helper.from_array(w, "w"),
                  numpy_helper.from_array(s.reshape(3, 1, 1), "s"),
                  numpy_helper.from_array(t.reshape(3, 1, 1), "t")]
    return _tiny(nodes, inits, [1, 2, 4, 4], "y", [1, 3, 4, 4])


def test_a_conv_the_candidate_folded_a_batch_norm_into_carries_its_inputs_error():
    """y: Conv -> Mul -> Add in the reference, one Conv in the candidate; m's error
    (6e-5, within its scale's bound: 40) moves y by up to max_o sum|w'[o]| * 6e-5, over
    y's own bound; a fold 1% off still fails."""
    x = np.zeros((1, 2, 4, 4), np.float32)
    x[0, 0, 0, 0] = 1.0  # m's scale: 40
    x[0, 1] = 1e-2
    removed = {"conv": "fuse-conv-mul", "scaled": "fuse-conv-bias"}
    ok = compare_layerwise(_folded_bn(), _folded_bn(shift=6e-5, fold=True), [{"x": x}],
                           removed=removed)
    assert ok.passed, ok.first_divergence
    y = ok.tensor("y")
    assert y.max_abs > 1e-5 * 10  # over y's own bound (its scale is below 10)
    bad = compare_layerwise(_folded_bn(), _folded_bn(shift=6e-5, fold=True, wrong=1.01),
                            [{"x": x}], removed=removed)
    assert not bad.passed and bad.first_divergence.name == "y"


def _fp16_inside(rng_seed: int = 0) -> onnx.ModelProto:
    """float32 in and out, float16 inside (onnxconverter-common's keep_io_types):
    Cast -> Conv -> BatchNormalization -> Cast."""
    rng = np.random.default_rng(rng_seed)
    c = 16

    def f16(a, name):
        return numpy_helper.from_array(np.asarray(a, np.float16), name)

    inits = [f16(rng.standard_normal((c, 3, 3, 3)) * 0.3, "w"),
             f16(rng.uniform(0.5, 1.5, c), "g"), f16(rng.uniform(-0.2, 0.2, c), "b"),
             f16(rng.uniform(-0.5, 0.5, c), "m"), f16(rng.uniform(0.5, 2.0, c), "v")]
    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
             helper.make_node("Conv", ["x16", "w"], ["c16"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c16", "g", "b", "m", "v"], ["y16"]),
             helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(
        nodes, "fp16_inside", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 16, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_widening_cast_carries_the_float16_error_of_its_input():
    """fold-bn in float16 moves y16 by float16 rounding (within float16's bound); the
    Cast to float32 carries exactly that error, which float32's own bound (1e-5 of the
    scale, under one float16 ulp) would reject. A fold that is wrong still fails."""
    ref = _fp16_inside()
    result = run(ref, passes="fold-bn", check=False)
    feeds = [{"x": np.random.default_rng(s).standard_normal((1, 3, 16, 16), np.float32)}
             for s in range(2)]
    ok = compare_layerwise(ref, result.model, feeds, renamed=result.report.renamed,
                           removed=result.report.removed)
    assert ok.passed, ok.first_divergence
    assert ok.tensor("y").max_rel > 1e-5  # over float32's own bound (rel: to the scale)
    conv = next(n for n in result.model.graph.node if n.op_type == "Conv")
    bad = perturb(result.model, conv.input[1])
    wrong = compare_layerwise(ref, bad, feeds, renamed=result.report.renamed,
                              removed=result.report.removed)
    assert not wrong.passed and wrong.first_divergence.name == "y16"
