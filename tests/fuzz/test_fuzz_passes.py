"""Every pass, alone and as `trt-prep`, on random small models (tests/fuzz/graphgen.py):
nothing is rolled back, the result passes onnx.checker and gives the original's outputs
(the manager's check, and again here on other inputs, with onnxruntime's optimizations
off), and a second run changes nothing.

The CI run draws a fixed set of examples (profile `graphfix-ci`); `pytest -m fuzz` draws
many random ones. A case fuzzing finds becomes a plain test in test_fuzz_regressions.py.
"""

from __future__ import annotations

import fuzzprofiles  # noqa: F401 (registers the hypothesis profiles)
import numpy as np
import onnx
import pytest
from graphgen import Drawn, models
from hypothesis import given, settings

from graphfix import api
from graphfix.passes.registry import PRESET_REGISTRY, REGISTRY
from graphfix.report import UNCHANGED
from graphfix.runtime.feeds import graph_inputs, resolve_shapes
from graphfix.runtime.outputs import OutputCheck

PIPELINES = (*REGISTRY, *PRESET_REGISTRY)  # every pass alone, and each preset
# Passes whose job is to change the graph outputs (add-nms appends NMS to any one rank-3
# float output, as a raw detection head; split-nms cuts the model before its NMS): the
# manager checks them on what they keep; the output properties here do not apply.
CHANGE_OUTPUTS = frozenset({"add-nms", "split-nms"})


def _signature(model: onnx.ModelProto) -> list[tuple[str, int]]:
    return [(o.name, o.type.tensor_type.elem_type) for o in model.graph.output]


def check_pipeline(drawn: Drawn, pipeline: str) -> None:
    """The properties every pipeline keeps on `drawn`; an AssertionError says which."""
    model = drawn.model
    result = api.run(model, pipeline, seed=0)
    report = result.report
    assert report.check.enabled, f"{pipeline}: {report.check.skipped_reason}"
    assert not report.rolled_back, f"{pipeline}: " + "; ".join(
        f"{r.spec} rolled back ({r.rollback_cause}): {r.rollback_reason}"
        for r in report.rolled_back)
    onnx.checker.check_model(result.model, full_check=True)
    if pipeline not in CHANGE_OUTPUTS:
        _same_outputs(drawn, result.model, pipeline)
    second = api.run(result.model, pipeline, seed=0)
    changed = [r.spec for r in second.report.passes if r.status != UNCHANGED]
    assert not changed, f"{pipeline}: a second run changed the model again: {changed}"
    assert second.model.SerializeToString() == result.model.SerializeToString(), pipeline


def _same_outputs(drawn: Drawn, rewritten: onnx.ModelProto, pipeline: str) -> None:
    """Same output names and dtypes, and the numerical core's verdict on inputs other than
    the manager's (onnxruntime, graph optimizations off); both branches of an If."""
    model = drawn.model
    assert _signature(rewritten) == _signature(model), pipeline
    shapes = resolve_shapes(graph_inputs(model), {})
    for values in [{}] if drawn.cond is None else [{drawn.cond: [1]}, {drawn.cond: [0]}]:
        again = OutputCheck.prepare(model, shapes, seed=7, values=values).verify(rewritten)
        assert again.ok, f"{pipeline} on other inputs {values}: {again.describe()}"


def check_all(drawn: Drawn) -> None:
    for pipeline in PIPELINES:
        check_pipeline(drawn, pipeline)


@settings(settings.get_profile("graphfix-ci"))
@given(models())
def test_every_pass_keeps_random_models(drawn):
    check_all(drawn)


@pytest.mark.fuzz
@settings(settings.get_profile("graphfix-fuzz"))
@given(models(max_nodes=10))
def test_every_pass_keeps_random_models_long(drawn):
    check_all(drawn)


def test_the_generator_makes_models_onnxruntime_runs():
    """The strategy itself: the models are valid, varied, and run as drawn."""
    from hypothesis import find

    drawn = find(models(), lambda d: any(n.op_type == "If" for n in d.model.graph.node),
                 settings=settings(database=None, derandomize=True, max_examples=2000))
    shapes = resolve_shapes(graph_inputs(drawn.model), {})
    check = OutputCheck.prepare(drawn.model, shapes, seed=0, values={drawn.cond: [1]})
    assert check.enabled, check.skipped_reason
    assert all(np.all(np.isfinite(v)) for v in check.reference.values())
