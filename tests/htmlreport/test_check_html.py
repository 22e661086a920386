"""check_html on real layer-wise reports: a perturbed weight (strict), a Q/DQ model (sqnr),
no compared tensor, and 5,000 tensors; the page is balanced, self-contained and inert."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from pagecheck import (
    HOSTILE,
    HOSTILE_SHOWN,
    assert_hostile_name_is_inert,
    page_data,
    parse_page,
)

from graphfix import samples
from graphfix.calibration.runner import calibrate
from graphfix.check.layerwise import compare_layerwise
from graphfix.check.samples import check_samples
from graphfix.htmlreport import check_html
from graphfix.htmlreport._checkplot import MAX_MARKERS
from graphfix.htmlreport.check import MAX_ALL_ROWS, MAX_ROWS
from graphfix.text import printable


def _rename(model: onnx.ModelProto, old: str, new: str) -> None:
    for node in model.graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
        node.output[:] = [new if o == old else o for o in node.output]


def _perturbed(model: onnx.ModelProto, weight: str, delta: float = 0.05) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    init = next(t for t in out.graph.initializer if t.name == weight)
    values = numpy_helper.to_array(init).copy()
    values.flat[values.size // 2] += delta
    init.CopyFrom(numpy_helper.from_array(values, weight))
    return out


@pytest.fixture(scope="module")
def strict():
    """conv_bn_relu_residual vs itself with one weight of block.0 moved; block.0's ReLU
    output carries a hostile name."""
    ref = samples.conv_bn_relu_residual()
    _rename(ref, "block.0.relu", HOSTILE)
    feeds = check_samples(ref, None, None, {}, 2, 0)
    report = compare_layerwise(ref, _perturbed(ref, "block.0.weight"), feeds)
    assert report.mode == "strict" and report.first_divergence.name == "block.0.conv"
    return report, check_html(report, reference="ref.onnx", candidate="new.onnx")


@pytest.fixture(scope="module")
def sqnr():
    """FP32 vs its minmax Q/DQ INT8 model, the threshold set so some layers fail (the verdict
    is the outputs')."""
    fp32 = samples.conv_bn_relu_residual()
    rng = np.random.default_rng(0)
    data = [{"input": rng.standard_normal((4, 3, 32, 32)).astype(np.float32)}
            for _ in range(2)]
    result = calibrate(fp32, data, ("minmax",))
    feeds = check_samples(result.fp32, None, None, {}, 2, 0)
    report = compare_layerwise(result.fp32, result.outcome().model, feeds, sqnr_threshold=40.0)
    assert report.mode == "sqnr" and report.first_divergence is not None
    return report, check_html(report, reference="fp32.onnx", candidate="int8.onnx")


def _titles(root) -> list[str]:
    plot = root.find("svg", cls="plot")
    return [t.text() for t in plot.iter("title")]


@pytest.mark.parametrize("which", ["strict", "sqnr"])
def test_the_page_is_balanced_self_contained_and_carries_the_report(which, request):
    report, page = request.getfixturevalue(which)
    root = parse_page(page)
    assert page_data(root) == report.to_json()
    title = root.find("title").text()
    assert "ref.onnx" in title or "fp32.onnx" in title
    verdict = "passed" if report.passed else "FAILED"
    assert title.endswith(verdict) and root.find("span", cls="verdict").text() == verdict


def test_every_compared_tensor_has_a_mark_named_in_its_tooltip(strict):
    report, page = strict
    titles = _titles(parse_page(page))
    compared = [t for t in report.tensors if t.ok is not None]
    assert len(compared) == len(report.tensors) > 10
    for t in compared:
        head = f"#{t.order} {printable(t.name)}"
        assert any(s.startswith(head + "\n") for s in titles), t.name
        assert f"max abs {t.max_abs:.4g}" in page or t.max_abs == 0


def test_the_first_divergence_is_marked_in_the_plot_and_the_tables(strict):
    report, page = strict
    root = parse_page(page)
    first = report.first_divergence
    box = root.find("p", id="first-divergence")
    assert "First divergence" in box.text() and first.name in box.text() and "warn" in box.classes
    line = root.find("line", cls="fd")
    assert line.find("title").text() == f"first divergence: {first.name}"
    assert root.find("text", cls="fdlab").text().endswith(f"first divergence: {first.name}")
    row = root.find("tr", cls="first")
    assert first.name in row.text() and "FAIL" in row.text()


def test_origins_are_diamonds_ranked_in_their_tooltips(strict):
    report, page = strict
    root = parse_page(page)
    diamonds = list(root.find("svg", cls="plot").iter("path", cls="org"))
    assert report.origins and len(diamonds) == len(report.origins)
    for k, (mark, origin) in enumerate(zip(diamonds, report.origins, strict=True), 1):
        assert f"origin #{k}:" in mark.find("title").text()
        assert origin.name in mark.find("title").text()
    assert [r.text() for r in root.find("table", cls="origins").iter("tr")][1].startswith("1")


def test_exact_tensors_sit_in_the_zero_band_in_strict_mode(strict):
    report, page = strict
    plot = parse_page(page).find("svg", cls="plot")
    exact = [t for t in report.tensors if t.max_abs == 0]
    assert exact and len(list(plot.iter("path", cls="edge"))) == len(exact)
    assert "0 exact" in plot.text() and "max abs error (log)" in plot.text()


def test_sqnr_mode_draws_the_threshold_and_exact_tensors_at_the_top(sqnr):
    report, page = sqnr
    root = parse_page(page)
    plot = root.find("svg", cls="plot")
    assert root.find("line", cls="thr").find("title").text() == "threshold 40 dB"
    exact = [t for t in report.tensors if t.sqnr_db == math.inf]
    assert exact and "\u221e exact" in plot.text()
    assert len(list(plot.iter("path", cls="edge"))) == len(exact)
    table = root.find("h2", None).text()  # the first heading is the plot's
    assert table == "SQNR per tensor"
    assert "Sensitivity" in page and all(t.name in page for t in report.sensitivity())


def test_a_hostile_tensor_name_is_escaped_and_spelled_out(strict):
    report, page = strict
    assert any(t.name == HOSTILE for t in report.tensors)
    assert_hostile_name_is_inert(page)
    titles = _titles(parse_page(page))
    assert any(HOSTILE_SHOWN in s for s in titles)
    assert page_data(parse_page(page))["tensors"][6]["name"] == HOSTILE


def test_no_compared_tensor_gives_a_small_page_without_a_plot(strict):
    report, _ = strict
    empty = dataclasses.replace(report, tensors=[], first_divergence=None, origins=[])
    page = check_html(empty, reference="a.onnx", candidate="b.onnx")
    root = parse_page(page)
    assert page_data(root) == empty.to_json()
    assert not list(root.iter("svg")) and "nothing to plot" in page
    assert len(page) < 12_000


def _chain(n: int, swap: int | None = None) -> onnx.ModelProto:
    """x -> n-1 nodes alternating Neg and Sin; `swap`: node `swap` is Identity instead."""
    nodes, prev = [], "x"
    for i in range(n - 1):
        op = "Identity" if i == swap else ("Sin" if i % 2 else "Neg")
        nodes.append(helper.make_node(op, [prev], [f"t{i}"], name=f"n{i}"))
        prev = f"t{i}"
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 64])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_five_thousand_tensors_stay_a_page_of_bounded_size():
    ref = _chain(5000)
    feeds = [{"x": np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)}]
    report = compare_layerwise(ref, _chain(5000, swap=2501), feeds)
    assert len(report.tensors) == 5000 and report.first_divergence.name == "t2501"
    page = check_html(report, reference="long.onnx", candidate="long2.onnx")
    root = parse_page(page)
    assert page_data(root) == report.to_json()
    data = len(root.find("script", id="graphfix-data").text())
    assert len(page) - data < 600_000  # the page itself, without the embedded JSON
    assert len(page) < 3_000_000
    plot = root.find("svg", cls="plot")
    marks = [e for e in plot.iter() if e.classes & {"ok", "bad", "org"}]
    assert MAX_MARKERS // 2 <= len(marks) <= MAX_MARKERS // 2 + 1 + len(report.origins)
    assert all(m.find("title").text().startswith("#") for m in marks)
    assert "t2501" in root.find("p", id="first-divergence").text()
    assert "marks show the worst tensor of every 10 in a row" in page
    failing = sum(t.ok is False for t in report.tensors)
    assert f"{failing - MAX_ROWS} more not shown" in page
    assert f"{5000 - MAX_ALL_ROWS} more not shown" in page


def test_non_finite_errors_sit_in_the_top_band_with_their_own_marks(strict):
    """A NaN or inf error (what an overflowing candidate gives) cannot sit on a log axis:
    it is drawn in the top band as a triangle, its value in the tooltip."""
    report, _ = strict
    tensors = [dataclasses.replace(t) for t in report.tensors]
    tensors[8].max_abs, tensors[9].max_abs = math.nan, math.inf
    page = check_html(dataclasses.replace(report, tensors=tensors), reference="a.onnx",
                      candidate="b.onnx")
    plot = parse_page(page).find("svg", cls="plot")
    tips = [m.find("title").text() for m in plot.iter("path", cls="edge")
            if "bad" in m.classes]
    assert len(tips) == 2 and "max abs nan" in tips[0] and "max abs \u221e" in tips[1]
    assert "inf/nan" in plot.text()
