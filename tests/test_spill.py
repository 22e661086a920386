"""graphfix.spill: large weights a pass makes go to a temporary file for the run."""

from __future__ import annotations

import os

import numpy as np
from gfhelpers import conv_bn_model

from graphfix import api, io, weights
from graphfix.spill import ALIGN, Spill


def test_put_writes_aligned_deferred_references_and_close_deletes_them():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(5).astype(np.float32), np.arange(7, dtype=np.int64),
              rng.standard_normal((3, 4)).astype(np.float16), np.array([True, False])]
    with Spill() as spill:
        tensors = [spill.put(f"t{i}", a) for i, a in enumerate(arrays)]
        directory = spill.dir
        for tensor, array in zip(tensors, arrays, strict=True):
            assert weights.is_deferred(tensor)
            assert int(weights.reference(tensor)["offset"]) % ALIGN == 0
            np.testing.assert_array_equal(weights.to_array(tensor), array)
            assert weights.to_array(tensor).dtype == array.dtype
        assert spill.bytes == sum(a.nbytes for a in arrays)
    assert not os.path.exists(directory)


def _conv_bn(tmp_path):
    model = conv_bn_model()
    path = tmp_path / "m.onnx"
    io.save(model, path)
    return path, model


def test_a_run_spills_the_folded_weight_checks_it_and_keeps_a_self_contained_result(
        tmp_path, monkeypatch):
    path, model = _conv_bn(tmp_path)
    spilled, dirs = [], []
    put = Spill.put

    def recording(self, name, values):
        tensor = put(self, name, values)
        spilled.append(name)
        dirs.append(self.dir)
        return tensor

    monkeypatch.setattr(Spill, "put", recording)
    out = tmp_path / "out.onnx"
    result = api.run(str(path), passes="fold-bn", output=str(out))
    assert spilled == ["y_folded_weight"]
    assert result.report.passes[0].check.startswith("passed")
    assert not os.path.exists(dirs[0])  # gone when run returned
    assert not weights.deferred(result.model)  # read into the result before that
    eager = api.run(model, passes="fold-bn")  # the model in memory, spilled as well
    assert len(spilled) == 2 and not os.path.exists(dirs[1])
    assert result.model.SerializeToString() == eager.model.SerializeToString()
    assert io.load(str(out)).SerializeToString() == eager.model.SerializeToString()


def test_only_main_graph_initializers_no_body_reads_are_spilled():
    """gs exports a constant a body reads as that body's initializer too, and onnx.checker
    looks for the file of an external tensor outside the main graph (silero_vad: an
    inlined If left a large constant in a branch, and fold-constants was rolled back)."""
    import onnx
    import onnx_graphsurgeon as gs

    from graphfix.graph.convert import export, settle_constants
    from graphfix.graph.skeleton import skeleton

    rng = np.random.default_rng(0)

    def big(name):
        return gs.Constant(name, rng.standard_normal(20000).astype(np.float32))

    x = gs.Variable("x", np.float32, (20000,))
    cond = gs.Variable("c", np.bool_, ())
    main_only, read_in_body, inside = big("main_only"), big("read_in_body"), big("inside")
    then_out = gs.Variable("t", np.float32, (20000,))
    else_out = gs.Variable("e", np.float32, (20000,))
    then = gs.Graph(nodes=[gs.Node("Add", inputs=[x, read_in_body], outputs=[then_out])],
                    outputs=[then_out], name="then")
    other = gs.Graph(nodes=[gs.Node("Mul", inputs=[x, inside], outputs=[else_out])],
                     outputs=[else_out], name="else")
    a, y = gs.Variable("a", np.float32, (20000,)), gs.Variable("y", np.float32, (20000,))
    graph = gs.Graph(nodes=[gs.Node("Add", inputs=[x, main_only], outputs=[a]),
                            gs.Node("If", attrs={"then_branch": then, "else_branch": other},
                                    inputs=[cond], outputs=[y])],
                     inputs=[x, cond], outputs=[a, y], opset=17)
    with Spill() as spill:
        assert settle_constants(graph, spill) == 3
        assert weights.is_deferred(main_only._values.tensor)
        assert not weights.is_deferred(read_in_body._values.tensor)
        assert not weights.is_deferred(inside._values.tensor)
        model = export(graph)
        onnx.checker.check_model(skeleton(model))  # as the manager checks a candidate
        assert [t.name for t in weights.deferred(model)] == ["main_only"]


def test_puts_from_many_threads_get_their_own_aligned_ranges():
    import itertools
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(int(n)).astype(np.float32)
              for n in rng.integers(1, 200_000, 24)]
    with Spill() as spill, ThreadPoolExecutor(4) as pool:
        tensors = list(pool.map(lambda ia: spill.put(f"t{ia[0]}", ia[1]), enumerate(arrays)))
        ranges = sorted((int(weights.reference(t)["offset"]), int(weights.reference(t)["length"]))
                        for t in tensors)
        assert all(start % ALIGN == 0 for start, _ in ranges)
        for (start, length), (after, _) in itertools.pairwise(ranges):
            assert start + length <= after
        for tensor, array in zip(tensors, arrays, strict=True):
            np.testing.assert_array_equal(weights.to_array(tensor), array)
        assert spill.bytes == sum(a.nbytes for a in arrays)


def test_without_pwrite_puts_still_land_where_their_references_say(monkeypatch):
    monkeypatch.delattr(os, "pwrite")
    arrays = [np.arange(n, dtype=np.int32) for n in (3, 1000, 17)]
    with Spill() as spill:
        tensors = [spill.put(f"t{i}", a) for i, a in enumerate(arrays)]
        for tensor, array in zip(tensors, arrays, strict=True):
            np.testing.assert_array_equal(weights.to_array(tensor), array)
