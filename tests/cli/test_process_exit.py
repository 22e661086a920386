"""The console script's process ends at once after the command (`cli.app.entry`): what
the command wrote and printed is all there, and the exit status is Python's."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
from gfhelpers import parse

from graphfix.samples import conv_bn_relu_residual as conv_bn_relu

MODEL = parse('<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[1,4] x) => (float[1,4] y) { a = Identity(x) y = Relu(a) }""")


def _graphfix(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graphfix", *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def test_run_writes_and_prints_everything_before_the_process_ends(tmp_path):
    src, out, report = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(conv_bn_relu(), src)
    done = _graphfix("run", src, "-o", out, "--report", report, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "wrote " in done.stdout and str(out.name) in done.stdout  # the last line
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert json.loads(report.read_text())["nodes_after"] < len(conv_bn_relu().graph.node)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.onnx", "r.json"]


def test_json_on_stdout_is_complete(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(MODEL, src)
    done = _graphfix("run", src, "-p", "cleanup", "-o", tmp_path / "o.onnx", "--json",
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["nodes_after"] == 1


def test_exit_statuses_are_pythons(tmp_path):
    assert _graphfix("run", tmp_path / "missing.onnx", cwd=tmp_path).returncode == 2
    version = _graphfix("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("graphfix ")
    for code, status, err in (("sys.exit('stopped')", 1, "stopped\n"), ("sys.exit()", 0, ""),
                              ("sys.exit(7)", 7, ""), ("print('x', end='')", 0, "")):
        script = ("import sys\nimport graphfix.cli.app as a\n"
                  f"def fake():\n    {code}\na.main = fake\na.entry()\n"
                  "print('never reached')")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path)
        assert (done.returncode, done.stderr) == (status, err), done
        assert "never reached" not in done.stdout
