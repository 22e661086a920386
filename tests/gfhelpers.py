"""Test helpers: build models from ONNX text, apply a pass the way the manager does,
compare numerics in onnxruntime (graph optimizations off, seeded inputs)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser

from graphfix.check.inputs import graph_inputs, random_feeds, resolve_shapes
from graphfix.check.runtime import run_model
from graphfix.graph import fingerprint, to_graph, to_model
from graphfix.passes.base import Pass, PassContext, PassResult


def parse(text: str) -> onnx.ModelProto:
    """A model from ONNX text; checked strictly."""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    return model


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
