"""Execution providers: asking for one onnxruntime lacks, or cannot start, is the user's
error before any work; it never runs on the CPU unnoticed."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from graphfix import samples
from graphfix.cli.app import app
from graphfix.errors import GraphfixError
from graphfix.report import tool_versions
from graphfix.runtime.session import make_session, provider_names

runner = CliRunner()
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def test_short_and_full_names_map_to_onnxruntime_names():
    assert provider_names("cpu") == ("CPUExecutionProvider",)
    assert provider_names([" CPU ", ""]) == ("CPUExecutionProvider",)
    assert provider_names("CPUExecutionProvider") == ("CPUExecutionProvider",)


def test_an_empty_list_is_an_error():
    with pytest.raises(GraphfixError, match="names none"):
        provider_names(" , ")


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has CUDA")
def test_cuda_without_onnxruntime_gpu_says_how_to_get_it():
    with pytest.raises(GraphfixError) as err:
        provider_names("cuda,cpu")
    text = str(err.value)
    assert "'CUDAExecutionProvider' is not available" in text
    assert "onnxruntime-gpu" in text and "--providers cpu" in text


def test_an_unknown_name_lists_what_is_available():
    with pytest.raises(GraphfixError) as err:
        provider_names("gpu")
    assert "'gpu' is not available" in str(err.value)
    assert "CPUExecutionProvider" in str(err.value) and "full name" in str(err.value)


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_a_provider_onnxruntime_drops_at_start_is_an_error(monkeypatch):
    # onnxruntime lists the provider but the session comes up without it (its libraries
    # failed to load): CPU onnxruntime does the same with a name it lacks, once the
    # availability check is told that it has it
    listed = ort.get_available_providers() + ["CUDAExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: listed)
    if HAS_CUDA:
        pytest.skip("this onnxruntime starts CUDA")
    with pytest.raises(GraphfixError, match="could not start the execution provider "
                                            "'CUDAExecutionProvider'"):
        make_session(samples.conv_bn_relu_residual(), ("cuda", "cpu"))


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has CUDA")
@pytest.mark.parametrize("command", ["run", "check", "calibrate"])
def test_each_command_refuses_cuda_before_any_work(tmp_path, command):
    model = tmp_path / "m.onnx"
    onnx.save(samples.conv_bn_relu_residual(), model)
    before = model.read_bytes()
    out = tmp_path / "out.onnx"
    args = {"run": ["run", str(model), "-o", str(out)],
            "check": ["check", str(model), str(model)],
            "calibrate": ["calibrate", str(model), "--data", str(tmp_path / "absent.npz"),
                          "-o", str(out)]}[command]
    result = runner.invoke(app, [*args, "--providers", "cuda,cpu"])
    assert result.exit_code == 2, result.output
    # the provider is named, not the missing data: the check comes first
    assert "CUDAExecutionProvider" in " ".join(result.output.split())
    assert not out.exists() and model.read_bytes() == before


def test_reports_name_the_onnxruntime_that_ran():
    versions = tool_versions()
    assert versions["onnxruntime"].split()[0] == ort.__version__
    assert versions["onnxruntime"].endswith("(gpu)") == HAS_CUDA


def test_a_run_that_needs_no_session_does_not_import_onnxruntime(tmp_path):
    """`run --no-check` on a model whose folds numpy computes makes no session: the CPU
    provider is not looked up in onnxruntime (always there) and its logs are quieted
    lazily, so the 20 ms import is not paid (bench/RESULTS.md, ninth round)."""
    import subprocess
    import sys

    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(samples.conv_bn_relu_residual(), src)
    code = ("import sys\n"
            "from graphfix.cli.app import app\n"
            f"try:\n    app([\"run\", {str(src)!r}, \"-o\", {str(out)!r}, \"--no-check\"])\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('onnxruntime' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "False"
    assert out.exists()
