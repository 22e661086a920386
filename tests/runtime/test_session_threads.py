"""Every onnxruntime session in graphfix's process has bounded threads (issue 15 a)."""

import os
import sys
import threading
import time

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import graphfix
from graphfix.runtime import session as session_mod
from graphfix.runtime.session import (
    intra_op_threads,
    make_session,
    session_options,
)

CPU = ["CPUExecutionProvider"]


def _relu() -> onnx.ModelProto:
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [2])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _endless_loop() -> onnx.ModelProto:
    """A Loop with all-constant inputs (what constant folding would evaluate) whose
    trip count is 2^62 and whose condition never turns false."""
    body = h.make_graph(
        [h.make_node("Identity", ["c_in"], ["c_out"]), h.make_node("Neg", ["v_in"], ["v_out"])],
        "body", [h.make_tensor_value_info("i", T.INT64, []),
                 h.make_tensor_value_info("c_in", T.BOOL, []),
                 h.make_tensor_value_info("v_in", T.FLOAT, [1])],
        [h.make_tensor_value_info("c_out", T.BOOL, []),
         h.make_tensor_value_info("v_out", T.FLOAT, [1])])
    g = h.make_graph([h.make_node("Loop", ["M", "", "v0"], ["y"], body=body)], "g", [],
                     [h.make_tensor_value_info("y", T.FLOAT, [1])],
                     [h.make_tensor("M", T.INT64, [], [2**62]),
                      h.make_tensor("v0", T.FLOAT, [1], [1.0])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_graphfix_sessions_use_the_cpus_they_may_and_one_inter_op_thread():
    options = session_options()
    assert options.intra_op_num_threads == intra_op_threads()
    assert 1 <= intra_op_threads() <= (os.cpu_count() or 1)
    assert options.inter_op_num_threads == 1
    got = make_session(_relu()).get_session_options()
    assert (got.intra_op_num_threads, got.inter_op_num_threads) == (intra_op_threads(), 1)


def test_fold_constants_does_not_run_an_endless_loop_of_constants():
    """The Loop reads only constants, so fold-constants would evaluate it: its session
    refuses the model (`runtime.work`) instead of running 2^62 trips, the rest of the
    run goes on, and the note says why the Loop stayed."""
    t0 = time.perf_counter()
    result = graphfix.run(_endless_loop(), passes="fold-constants", check=False)
    assert time.perf_counter() - t0 < 20
    assert [n.op_type for n in result.model.graph.node] == ["Loop"]
    notes = " ".join(result.report.passes[0].notes)
    assert "Loop 'y' would run its body 4611686018427387904 times" in notes


# --- the process's threads during a run ---------------------------------------------------

def _threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads: line")


def _many_foldable_subgraphs(n: int = 24) -> onnx.ModelProto:
    """`n` If nodes on a computed (never constant) condition; each branch holds a
    constant subexpression that fold-constants evaluates in its own session. One else
    branch holds a part onnxruntime fails to evaluate (a Gather out of range), which
    onnx-graphsurgeon 0.6's folding retried with its sessions still alive (a recursion
    to Python's limit): every one of them held a thread pool."""
    cond = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            h.make_node("Abs", ["s"], ["a"]),
            h.make_node("Constant", [], ["neg"], value=h.make_tensor("", T.FLOAT, [], [-1.0])),
            h.make_node("Greater", ["a", "neg"], ["cond"])]
    nodes, outputs = list(cond), []
    for k in range(n):
        branches = []
        for side in ("then", "else"):
            bad = side == "else" and k == 0
            ops = [h.make_node("Constant", [], [f"{side}{k}_c"],
                               value=h.make_tensor("", T.FLOAT, [2], [k, 1.0])),
                   h.make_node("Constant", [], [f"{side}{k}_i"],
                               value=h.make_tensor("", T.INT64, [1], [7 if bad else 1])),
                   h.make_node("Gather", [f"{side}{k}_c", f"{side}{k}_i"], [f"{side}{k}_g"]),
                   h.make_node("Mul", [f"{side}{k}_g", f"{side}{k}_g"], [f"{side}{k}_m"]),
                   h.make_node("Add", ["x", f"{side}{k}_m"], [f"{side}{k}_o"])]
            branches.append(h.make_graph(ops, f"{side}{k}", [], [
                h.make_tensor_value_info(f"{side}{k}_o", T.FLOAT, [2])]))
        nodes.append(h.make_node("If", ["cond"], [f"y{k}"], then_branch=branches[0],
                                 else_branch=branches[1]))
        outputs.append(h.make_tensor_value_info(f"y{k}", T.FLOAT, [2]))
    g = h.make_graph(nodes, "many_ifs", [h.make_tensor_value_info("x", T.FLOAT, [2])], outputs)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/status")
def test_a_run_with_many_foldable_subgraphs_holds_few_threads():
    model = _many_foldable_subgraphs()
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _threads())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(0.01)
    before = _threads()  # this process's own threads, the sampler's included
    try:
        result = graphfix.run(model, passes="fold-constants")
    finally:
        stop.set()
        sampler.join()
    assert result.report.check.enabled
    # one graphfix session at a time (its pool: intra_op_threads() - 1 threads); the
    # margin is for onnxruntime's and Python's own helpers
    bound = before + intra_op_threads() + 4
    assert peak[0] <= bound, f"{peak[0]} threads at once (bound {bound}, {before} before)"


def test_intra_op_threads_follows_the_cgroup_quota(monkeypatch, tmp_path):
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    real_open = open

    def fake_open(path, *args, **kwargs):
        if path == "/sys/fs/cgroup/cpu.max":
            return real_open(tmp_path / "cpu.max", *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr("builtins.open", fake_open)
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    assert session_mod.intra_op_threads() == 2
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert session_mod.intra_op_threads() == 8
