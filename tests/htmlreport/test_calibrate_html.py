"""calibrate_html on real calibrations with every method: a small CNN, a HardSwish-like
tensor that TensorRT-style entropy clips (issue 13's "entropy cliff"), and a deep network
with hundreds of quantized tensors; the page is balanced, self-contained and inert."""

from __future__ import annotations

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
from graphfix.calibration.runner import Request, calibrate
from graphfix.htmlreport import calibrate as calibrate_module
from graphfix.htmlreport import calibrate_html
from graphfix.htmlreport.calibrate import BARS
from graphfix.text import printable

ALL_ENTROPY_FIRST = "entropy,auto,minmax,percentile,mse"  # every method; entropy is written


def _cliff_model() -> onnx.ModelProto:
    """h -> HardSwish -> HOSTILE -> Conv -> y, and x -> Conv -> z: two quantized inputs,
    the HardSwish output with most of its mass near zero and a sparse tail."""
    rng = np.random.default_rng(0)
    w = [numpy_helper.from_array((rng.standard_normal((4, 1, 3, 3)) / 3).astype(np.float32),
                                 f"w{i}") for i in range(2)]
    nodes = [helper.make_node("HardSwish", ["h"], [HOSTILE], name="hs"),
             helper.make_node("Conv", ["x", "w1"], ["z"], name="conv_x", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", [HOSTILE, "w0"], ["y"], name="conv_h", pads=[1, 1, 1, 1])]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", c, 16, 16])
          for n, c in (("h", 1), ("x", 1), ("y", 4), ("z", 4))]
    graph = helper.make_graph(nodes, "cliff", io[:2], io[2:], w)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _cliff_data() -> list[dict[str, np.ndarray]]:
    """h: N(-0.8, 0.9) with 0.2 % of the values from U(1, 7) (test_clipping's mixture);
    x: standard normal."""
    rng = np.random.default_rng(1)
    h = rng.normal(-0.8, 0.9, (400, 1, 16, 16))
    tail = rng.random(h.shape) < 0.002
    h[tail] = rng.uniform(1.0, 7.0, int(tail.sum()))
    x = rng.standard_normal(h.shape)
    return [{"h": h[i:i + 100].astype(np.float32), "x": x[i:i + 100].astype(np.float32)}
            for i in range(0, 400, 100)]


@pytest.fixture(scope="module")
def cliff():
    result = calibrate(_cliff_model(), _cliff_data(), Request.make(ALL_ENTROPY_FIRST))
    assert result.recommended == "entropy"
    assert [c.tensor for c in result.outcome().clips] == [HOSTILE]
    return result, calibrate_html(result, model="cliff.onnx")


@pytest.fixture(scope="module")
def cnn():
    rng = np.random.default_rng(0)
    data = [{"input": rng.standard_normal((4, 3, 32, 32)).astype(np.float32)} for _ in range(2)]
    result = calibrate(samples.conv_bn_relu_residual(), data, Request.make("all"),
                       eval_data=data[:1])
    assert [o.method for o in result.outcomes] == ["auto", "entropy", "minmax", "percentile",
                                                   "mse"]
    return result, calibrate_html(result, model="cnn.onnx")


def _cards(root) -> list[tuple[str, object]]:
    """(tensor name as shown, card element) in page order."""
    out = []
    for card in root.iter("div", cls="card"):
        name = card.find("h3").find("code")
        out.append((name.attrs.get("title") or name.text(), card))
    return out


@pytest.mark.parametrize("which", ["cliff", "cnn"])
def test_the_page_is_balanced_self_contained_and_carries_the_ranges(which, request):
    result, page = request.getfixturevalue(which)
    root = parse_page(page)
    assert page_data(root) == result.ranges_json()
    methods = root.find("table")
    for outcome in result.outcomes:
        assert outcome.method in methods.text()
    assert "\u2713 written" in methods.find("tr", cls="used").text()
    assert result.recommended in methods.find("tr", cls="used").text()


def test_every_quantized_tensor_has_a_histogram_with_every_methods_amax(cnn):
    result, page = cnn
    used = result.outcome()
    cards = _cards(parse_page(page))
    assert [n for n, _ in cards] == [printable(t) for t in used.amaxes]
    for name, card in cards:
        svg = card.find("svg", cls="hist")
        tips = [line.find("title").text() for line in svg.iter("line", cls="m")]
        assert [t.split(":")[0] for t in tips] == \
            [o.method for o in result.outcomes if o is not used] + [used.method]
        (bold,) = svg.iter("line", cls="used")
        assert bold.find("title").text().startswith(f"{used.method}: amax ")
        assert svg.find("line", cls="obs").find("title").text().startswith("observed amax")
        bars = svg.find("path", cls="bars").attrs["d"]
        assert 2 <= bars.count("V") <= min(BARS, result.stats[name].bins) + 1
        assert "clipped" not in card.classes
    assert "no bad clips" in page and "CLIPPED" not in page


def test_the_clipped_tensor_comes_first_flagged_and_shaded(cliff):
    result, page = cliff
    root = parse_page(page)
    (clip,) = result.outcome().clips
    cards = _cards(root)
    assert [n for n, _ in cards] == [HOSTILE_SHOWN, "x"]  # plan order is x, then HOSTILE
    first = cards[0][1]
    assert "clipped" in first.classes and "clipped" not in cards[1][1].classes
    assert first.find("span", cls="badge").text() == f"CLIPPED \u2212{clip.lost_db:.1f} dB"
    shade = first.find("rect", cls="cliparea")
    assert shade.find("title").text().startswith("clipped by entropy")
    assert float(shade.attrs["width"]) > 200  # entropy keeps about a quarter of the range
    assert root.find("div", cls="warn").text() == printable(clip.message())
    assert "1 tensor clipped" in root.find("h1").text()


def test_a_hostile_tensor_name_is_escaped_and_spelled_out(cliff):
    result, page = cliff
    assert_hostile_name_is_inert(page)
    assert HOSTILE in page_data(parse_page(page))["tensors"]


def test_hundreds_of_tensors_stay_a_page_of_bounded_size(monkeypatch):
    model = samples.deep_resnet(blocks=200, size=8, classes=10)
    data = [{"input": np.random.default_rng(0).standard_normal((2, 3, 8, 8))
             .astype(np.float32)}]
    result = calibrate(model, data, Request.make("all"))
    names = list(result.outcome().amaxes)
    assert len(names) > 200
    page = calibrate_html(result, model="deep.onnx")
    root = parse_page(page)
    assert page_data(root) == result.ranges_json()
    assert len(_cards(root)) == len(names)
    assert len(page) < 10_000 + 4_000 * len(names)  # about 3.3 kB a tensor, JSON included
    monkeypatch.setattr(calibrate_module, "MAX_PLOTS", 50)  # past it: a table, no plots
    root = parse_page(calibrate_html(result, model="deep.onnx"))
    assert [n for n, _ in _cards(root)] == names[:50]
    assert f"{len(names) - 50} more tensors, without a histogram" in root.text()
    assert list(root.iter("tr"))[-1].find("code").text() == names[-1]
