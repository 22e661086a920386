"""The method registry is the one list: the CLI's --method help and checks, --method all,
--per-tensor, the cache header and docs/calibrate.md all derive from it; option values are
checked before any statistics are collected."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from calhelpers import stats_of_array
from typer.testing import CliRunner

from graphfix.calibration import algorithms as A
from graphfix.calibration import methods
from graphfix.calibration.runner import Request
from graphfix.cli.app import app
from graphfix.errors import GraphfixError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "calibrate.md"
NAMES = [m.name for m in methods.METHODS]


def test_one_list_of_unique_names_with_auto_the_default():
    assert NAMES == ["auto", "entropy", "minmax", "percentile", "mse"]
    assert methods.DEFAULT == "auto" and methods.get("auto").amax is None
    assert set(methods.AUTO_CHOICES) == {m.name for m in methods.METHODS if m.amax}
    assert [m.name for m in methods.METHODS if m.exact_histogram] == ["entropy"]


def test_parse_all_lists_and_near_misses():
    assert methods.parse("all") == tuple(NAMES)
    assert methods.parse("mse, entropy,mse") == ("mse", "entropy")
    with pytest.raises(GraphfixError, match="Did you mean 'entropy'"):
        methods.parse("entropi")
    with pytest.raises(GraphfixError, match="--method is empty"):
        methods.parse(" , ")


def test_options_are_checked_against_their_range():
    assert methods.options_for({})["percentile"] == {"p": 99.99}
    assert methods.options_for({"--percentile": 100})["percentile"] == {"p": 100.0}
    for bad in (0, -1, 150):
        with pytest.raises(GraphfixError, match=f"--percentile {bad:g} is out of range"):
            methods.options_for({"--percentile": bad})


def test_per_tensor_labels_say_what_was_chosen_among():
    assert Request.make("all", per_tensor=True).labels() == ("auto",)
    assert Request.make("auto").labels() == ("auto",)
    two = Request.make("entropy,percentile", {"--percentile": 99.9}, per_tensor=True)
    assert two.labels() == ("per-tensor(entropy,percentile)",)
    assert two.options["percentile"] == {"p": 99.9} and two.exact
    with pytest.raises(GraphfixError, match="nothing to choose from"):
        Request.make("mse", per_tensor=True)
    assert not Request.make("auto").exact and Request.make("all").exact


def test_choose_takes_the_lowest_simulated_error_ties_to_the_first():
    rng = np.random.default_rng(0)
    shapes = {"relu": np.maximum(rng.standard_normal(50_000), 0),
              "outlier": np.append(rng.standard_normal(50_000), 40.0),
              "uniform": rng.uniform(-1, 1, 50_000)}
    stats = {k: stats_of_array(v.astype(np.float32), name=k) for k, v in shapes.items()}
    plain = methods.plain_ranges(stats, methods.options_for({}))
    choices = ("minmax", "entropy", "percentile")
    picked = methods.choose(stats, plain, choices, "per-tensor")
    for tensor, s in stats.items():
        errors = A.quantization_mse(s, [plain[c].amaxes[tensor] for c in choices])
        k = int(np.argmin(errors))  # the first of equal minima
        assert (picked.chosen[tensor], picked.amaxes[tensor]) == (choices[k],
                                                                  plain[choices[k]].amaxes[tensor])
    with pytest.raises(GraphfixError, match="no range formula"):
        methods.choose(stats, plain, ("auto", "mse"))


def test_cli_help_lists_every_method_and_option():
    text = CliRunner().invoke(app, ["calibrate", "--help"], env={"COLUMNS": "400"}).stdout
    flat = re.sub(r"\s+", " ", text.replace("│", " "))
    for m in methods.METHODS:
        assert m.name in flat, m.name
        for option in m.options:
            assert option.flag in flat
    assert "[default: auto]" in flat


def test_docs_table_is_the_registry():
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("<!-- methods:begin -->") + len("<!-- methods:begin -->")
    assert text[start:text.index("<!-- methods:end -->")].strip() == methods.markdown_table()


def test_bad_option_values_fail_before_any_statistics(shared_model, tmp_path, monkeypatch):
    from graphfix.calibration import stats

    def forbidden(*args, **kwargs):
        raise AssertionError("statistics were collected")

    monkeypatch.setattr(stats, "collect", forbidden)
    model, data = shared_model("digits_dev.onnx"), shared_model("digits_dev_data.npz")
    for args, text in ((["--percentile", "150"], "out of range"),
                       (["--method", "entropy,kl"], "Unknown calibration method 'kl'"),
                       (["--method", "minmax", "--per-tensor"], "nothing to choose")):
        result = CliRunner().invoke(app, ["calibrate", str(model), "--data", str(data),
                                          "--data-key", "calib", "-o", str(tmp_path / "q.onnx"),
                                          *args])
        assert result.exit_code == 2, result.output
        assert text in result.stderr
        assert not (tmp_path / "q.onnx").exists()
