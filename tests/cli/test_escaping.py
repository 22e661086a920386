"""Names from a model reach the terminal spelled out, never raw: an ANSI escape sequence,
a bidi override or rich markup in a node or tensor name is shown as text by every command;
JSON keeps the exact names; pickled data is refused."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from typer.testing import CliRunner

from graphfix.cli.app import app
from graphfix.text import printable

runner = CliRunner()

EVIL = "\x1b[2J\u202e[red]x[/red]"  # clear screen, right-to-left override, rich markup
SHOWN = "\\x1b[2J\\u202e[red]x[/red]"


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    """Tables wide enough that no name is folded over two lines."""
    monkeypatch.setenv("COLUMNS", "400")


def _model(path, seed: int = 0, op: str = "Hardmax", second_reader: bool = False):
    """x<EVIL> [1,3,8,8] -> Conv 'conv<EVIL>' -> c<EVIL> -> `op` 'op<EVIL>'(c<EVIL>[, k<EVIL>])
    -> y; with `second_reader`, c<EVIL> is also read by Relu 'relu<EVIL>' -> r."""
    x, c = "x" + EVIL, "c" + EVIL
    weights = np.random.default_rng(seed).standard_normal([4, 3, 3, 3]).astype(np.float32)
    inits = [numpy_helper.from_array(weights, "W")]
    nodes = [helper.make_node("Conv", [x, "W"], [c], name="conv" + EVIL)]
    outputs = [helper.make_tensor_value_info("y", TP.FLOAT, [1, 4, 6, 6])]
    if op == "Add":
        inits.append(numpy_helper.from_array(np.ones([1, 4, 1, 1], np.float32), "k" + EVIL))
        nodes.append(helper.make_node("Add", [c, "k" + EVIL], ["y"], name="op" + EVIL))
    else:
        nodes.append(helper.make_node(op, [c], ["y"], name="op" + EVIL))
    if second_reader:
        nodes.append(helper.make_node("Relu", [c], ["r"], name="relu" + EVIL))
        outputs.append(helper.make_tensor_value_info("r", TP.FLOAT, [1, 4, 6, 6]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(x, TP.FLOAT,
                                                                         [1, 3, 8, 8])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def _assert_spelled_out(text: str) -> None:
    assert "\x1b" not in text and "\u202e" not in text
    assert SHOWN in text


def test_printable_spells_out_controls_and_bidi_only():
    assert printable("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert printable("\u202e\u2066\u200f\x00\x7f\x9b\r\n\t") == (
        "\\u202e\\u2066\\u200f\\x00\\x7f\\x9b\\x0d\\x0a\\x09")
    assert printable("line\nnext\t\x1b", keep="\n\t") == "line\nnext\t\\x1b"
    plain = "conv_1/weights:0 [red] é 你好 \\x1b"
    assert printable(plain) == plain == printable(printable(plain))


def test_doctor_table_shows_names_spelled_out_and_json_keeps_them(tmp_path):
    path = _model(tmp_path / "m.onnx")
    table = runner.invoke(app, ["doctor", str(path), "--trt", "8.6", "--no-parser"])
    assert table.exit_code == 1, table.output
    _assert_spelled_out(table.stdout)
    assert f"Hardmax 'op{SHOWN}'" in table.stdout
    as_json = runner.invoke(app, ["doctor", str(path), "--trt", "8.6", "--no-parser", "--json"])
    assert "\x1b" not in as_json.stdout and "\u202e" not in as_json.stdout  # JSON escapes
    nodes = [n for f in json.loads(as_json.stdout)["findings"] for n in f["nodes"]]
    assert f"Hardmax 'op{EVIL}'" in nodes


def test_run_table_notes_and_explain_show_names_spelled_out(tmp_path):
    path = _model(tmp_path / "m.onnx", op="Add", second_reader=True)
    args = ["run", str(path), "-o", str(tmp_path / "o.onnx"), "--passes", "fuse-conv-bias"]
    result = runner.invoke(app, [*args, "--explain"])
    assert result.exit_code == 0, result.output
    _assert_spelled_out(result.stdout)
    assert f"Add 'op{SHOWN}'" in result.stdout  # the pass's note, in the table
    assert f"Relu 'relu{SHOWN}'" in result.stdout  # --explain's chain in the way
    report = runner.invoke(app, [*args, "--json"])
    assert report.exit_code == 0, report.output
    notes = json.loads(report.stdout)["passes"][0]["notes"]
    assert any(f"Add 'op{EVIL}'" in n for n in notes), notes


def test_check_tables_show_names_spelled_out_and_json_keeps_them(tmp_path):
    ref, cand = _model(tmp_path / "a.onnx"), _model(tmp_path / "b.onnx", seed=1)
    result = runner.invoke(app, ["check", str(ref), str(cand)])
    assert result.exit_code == 1, result.output
    _assert_spelled_out(result.stdout)
    assert f"first divergence: c{SHOWN}" in result.stdout
    as_json = runner.invoke(app, ["check", str(ref), str(cand), "--json"])
    assert json.loads(as_json.stdout)["first_divergence"]["name"] == "c" + EVIL


def test_error_messages_show_names_spelled_out(tmp_path):
    path = _model(tmp_path / "m.onnx")
    data = tmp_path / "d.npy"
    np.save(data, np.zeros([2, 1, 3, 8, 8], np.float32))  # one axis too many
    for command in (["calibrate", str(path), "-o", str(tmp_path / "q.onnx")],
                    ["run", str(path), "-o", str(tmp_path / "o.onnx")]):
        result = runner.invoke(app, [*command, "--data", str(data)])
        assert result.exit_code == 2, result.output
        assert "error:" in result.stderr and f"'x{SHOWN}'" in result.stderr
        _assert_spelled_out(result.stderr)


def test_calibrate_output_has_no_raw_controls(tmp_path):
    path = _model(tmp_path / "m.onnx", op="Relu")
    data = tmp_path / "d.npy"
    np.save(data, np.random.default_rng(0).standard_normal([4, 3, 8, 8]).astype(np.float32))
    result = runner.invoke(app, ["calibrate", str(path), "--data", str(data),
                                 "-o", str(tmp_path / "q.onnx")])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\u202e" not in result.output
    written = onnx.load(tmp_path / "q.onnx")
    assert "x" + EVIL in [i.name for i in written.graph.input]


@pytest.mark.parametrize("command", ["run", "calibrate", "check"])
@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_pickled_data_is_refused(tmp_path, command, suffix):
    path = _model(tmp_path / "m.onnx", op="Relu")
    data = tmp_path / f"p{suffix}"
    objects = np.array([{"a": 1}], dtype=object)
    if suffix == ".npy":
        np.save(data, objects, allow_pickle=True)
    else:
        np.savez(data, **{"x" + "y": objects})
    args = {"run": ["run", str(path), "-o", str(tmp_path / "o.onnx")],
            "calibrate": ["calibrate", str(path), "-o", str(tmp_path / "q.onnx")],
            "check": ["check", str(path), str(path)]}[command]
    result = runner.invoke(app, [*args, "--data", str(data)])
    assert result.exit_code == 2, result.output
    assert "pickle" in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "o.onnx").exists() and not (tmp_path / "q.onnx").exists()


@pytest.mark.parametrize("part", ["../m.onnx", "sub/m.onnx", "..", "C:\\m.onnx"])
def test_split_manifest_parts_must_sit_beside_it(tmp_path, part):
    from graphfix.errors import GraphfixError
    from graphfix.nms.chain import SCHEMA, run_split

    _model(tmp_path / "m.onnx", op="Relu")
    (tmp_path / "sub").mkdir()
    _model(tmp_path / "sub" / "m.onnx", op="Relu")
    manifest = tmp_path / "sub" / "m.split.json"
    manifest.write_text(json.dumps({"schema": SCHEMA, "backbone": "m.onnx", "nms": part,
                                    "inputs": [], "cut": [], "nms_inputs": [],
                                    "outputs": []}))
    with pytest.raises(GraphfixError, match="not a file beside it"):
        run_split(manifest, {})
