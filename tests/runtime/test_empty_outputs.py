"""Outputs with no elements on the check's sample (a detector that finds nothing on
random inputs, a batch of 0) are not judged: the check says so instead of "exact"."""

from __future__ import annotations

import onnx
from gfhelpers import parse
from typer.testing import CliRunner

import graphfix
from graphfix.cli.app import app
from graphfix.runtime import outputs

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'
EMPTY = "empty on this sample: it has no elements to compare"


def detector(threshold: str = "1e6", scale: str = "2.0") -> str:
    """A score map thresholded far above what the Conv gives: no detection survives."""
    return HEADER + f"""
    g (float[1,2,4,4] x) => (float[1,2,4,4] map, int64[N,4] idx, float[N] scores)
      <float thr = {{{threshold}}}, float k = {{{scale}}}> {{
        map = Mul(x, k)
        keep = Greater(map, thr)
        nz = NonZero(keep)
        idx = Transpose <perm = [1, 0]> (nz)
        scores = GatherND(map, idx)
    }}"""


def test_empty_outputs_are_named_and_the_rest_still_judged():
    check = outputs.OutputCheck.prepare(parse(detector()), {"x": (1, 2, 4, 4)})
    assert check.empty == {"idx": EMPTY, "scores": EMPTY}
    assert not check.judges_nothing()  # `map` has values
    outcome = check.verify(parse(detector()))
    assert outcome.ok
    assert outcome.describe() == "passed (exact; empty on this sample, nothing compared: " \
                                 "idx, scores)"
    wrong = check.verify(parse(detector(scale="3.0")))
    assert not wrong.ok and wrong.describe().startswith("outputs differ: map: ")


def test_a_check_whose_every_output_is_empty_judges_nothing():
    model = parse(HEADER + """
    g (float[N,3] x) => (float[N,3] y) { y = Relu(x) }""")
    check = outputs.OutputCheck.prepare(model, {"x": (0, 3)})
    assert check.judges_nothing()
    outcome = check.verify(model)
    assert outcome.ok
    assert outcome.describe() == ("not judged: no output can be compared on this sample "
                                  "(empty: y)")


def test_a_changed_shape_of_an_empty_output_still_fails():
    check = outputs.OutputCheck.prepare(parse(detector()), {"x": (1, 2, 4, 4)})
    other = parse(HEADER + """
    g (float[1,2,4,4] x) => (float[1,2,4,4] map, int64[N,4] idx, float[N,1] scores)
      <float thr = {1e6}, float k = {2.0}, int64[2] flat = {-1, 1}> {
        map = Mul(x, k)
        keep = Greater(map, thr)
        nz = NonZero(keep)
        idx = Transpose <perm = [1, 0]> (nz)
        s = GatherND(map, idx)
        scores = Reshape(s, flat)
    }""")
    assert not check.verify(other).ok


def test_run_notes_the_empty_outputs_and_strict_fails_when_nothing_was_compared(tmp_path):
    """Probe 4: torchvision's Faster R-CNN with random weights gave 0 detections on the
    check's input, and 990 folded nodes were reported "passed (exact)"."""
    model = parse(HEADER + """
    g (float[1,2,4,4] x) => (int64[N,4] idx, float[N] scores)
      <float thr = {1e6}, float one = {1.0}> {
        m = Mul(x, one)
        keep = Greater(m, thr)
        nz = NonZero(keep)
        idx = Transpose <perm = [1, 0]> (nz)
        scores = GatherND(m, idx)
    }""")
    report = graphfix.run(model, passes="eliminate-noops").report
    assert report.passes[0].status == "applied"
    assert report.passes[0].check.startswith("not judged: no output can be compared")
    assert report.check.judged_nothing and report.check.unjudged == {"idx": EMPTY,
                                                                     "scores": EMPTY}
    assert (f"the check cannot judge 'idx' ({EMPTY}), 'scores' ({EMPTY}); pass --data "
            "with real inputs to check them") in report.verify_notes
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    out = tmp_path / "out.onnx"
    args = ["run", str(path), "-o", str(out), "--passes", "eliminate-noops"]
    assert CliRunner().invoke(app, args).exit_code == 0
    result = CliRunner().invoke(app, [*args, "--strict"])
    assert result.exit_code == 1
    assert "--strict: the numerical check compared no value" in result.output
