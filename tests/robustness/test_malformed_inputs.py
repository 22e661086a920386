"""Every malformed input × every command: a clear refusal, nothing lost, nothing left.

For each case of `malformed.py` and each command, the command runs in-process (typer's
runner, so an exception that would be an internal error fails the test) and must:
exit 2 (1 where the command reports findings, 0 only where the table says why), say
one paragraph `error: what. why. fix.` without a traceback, leave the files it was given
byte-identical, leave no output or temporary behind, and not grow by more than
MEMORY_MB however large the sizes the input declares (2^40 elements and the like).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
from malformed import DATA, MODELS, Files, good_data, good_model
from typer.testing import CliRunner

from graphfix.cli.app import app

MEMORY_MB = 400
COMMANDS = ("run", "doctor", "calibrate", "check", "plugins-match", "plugins-apply")
REFUSED = 2
FINDINGS = 1
# (case, command) -> exit code, where it is not REFUSED, and why that is right.
EXPECTED = {
    # a valid model that onnxruntime cannot run: doctor reports it; run rewrites it with
    # a warning that the check was skipped; calibrate needs only the part before it
    **{(case, cmd): code for case in ("opset 1", "unknown domain", "unknown op")
       for cmd, code in (("doctor", FINDINGS), ("run", 0), ("calibrate", 0),
                         ("plugins-match", 0))},
    # doctor reads shapes and ops only; a dim of 2^40 is a legal (if odd) shape
    ("input dims 2^40", "doctor"): 0,
    ("input dims 2^40", "plugins-match"): 0,
    # a Loop that would never finish: run rewrites it without the check (and says so),
    # doctor and plugins read no values, calibrate runs only the part before it (the
    # MatMul it quantizes); check refuses to run it
    ("Loop of 2^62 trips", "run"): 0,
    ("Loop of 2^62 trips", "calibrate"): 0,
    ("Loop of 2^62 trips", "doctor"): 0,
    ("Loop of 2^62 trips", "plugins-match"): 0,
    # a negative dim is treated as dynamic; the data gives its size
    ("negative input dim", "doctor"): 0,
    ("negative input dim", "calibrate"): 0,
    ("negative input dim", "plugins-match"): 0,
}
EXPECTED.update({(case, "plugins-apply"): code for (case, cmd), code in list(EXPECTED.items())
                 if cmd == "plugins-match"})  # an empty plan: apply reads what match does
DATA_COMMANDS = ("run", "calibrate", "check")
EMPTY_PLAN = "schema: graphfix.plugins-plan/1\nsubstitutions: []\n"
runner = CliRunner()


def _arguments(command: str, files: Files, folder: Path, with_data: bool) -> list[str]:
    model, data, out = str(files.model), str(files.data), str(folder / "out.onnx")
    given = ["--data", data] if with_data else []
    return {"run": ["run", model, "-o", out, *given],
            "doctor": ["doctor", model],
            "calibrate": ["calibrate", model, "--data", data, "-o", out],
            "check": ["check", model, model, *given],
            "plugins-match": ["plugins", "match", model, "-o", str(folder / "plan.yaml")],
            "plugins-apply": ["plugins", "apply", model, _plan(folder), "-o", out],
            }[command] + files.args.get(command, [])


def _plan(folder: Path) -> str:
    path = folder / "empty-plan.yaml"
    path.write_text(EMPTY_PLAN)
    return str(path)


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file()}


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _invoke(arguments: list[str]) -> tuple[object, int]:
    """(typer's result, the growth of peak memory in MB; 0 where it cannot be read)."""
    linux = sys.platform.startswith("linux")
    if linux:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM)
        except OSError:
            linux = False
    before = _rss_kb("VmRSS") if linux else 0
    result = runner.invoke(app, arguments)
    grown = (_rss_kb("VmHWM") - before) // 1024 if linux else 0
    return result, grown


def assert_refused_cleanly(folder: Path, arguments: list[str], expected: int) -> object:
    given = _hashes(folder)
    result, grown = _invoke(arguments)
    text = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"internal error: {result.exception!r}\n{text}") \
            from result.exception
    assert result.exit_code == expected, text
    assert "Traceback" not in text
    assert grown < MEMORY_MB, f"peak memory grew by {grown} MB"
    assert {k: v for k, v in _hashes(folder).items() if k in given} == given
    if expected == REFUSED:
        errors = [line for line in text.split("\n\n") if line.startswith("error: ")]
        assert len(errors) == 1, text
        assert errors[0].count(". ") >= 2 and errors[0].rstrip().endswith("."), errors[0]
    if expected != 0:
        assert sorted(p.name for p in folder.iterdir()) == sorted(given), \
            "an output or temporary was left behind"
    return result


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", sorted(MODELS))
def test_a_malformed_model_is_refused_cleanly(case, command, tmp_path):
    files = MODELS[case](tmp_path)
    expected = EXPECTED.get((case, command), REFUSED)
    result = assert_refused_cleanly(tmp_path, _arguments(command, files, tmp_path, False),
                                    expected)
    if expected == 0 and command == "run":
        assert "numerical check skipped" in result.output


@pytest.mark.parametrize("command", DATA_COMMANDS)
@pytest.mark.parametrize("case", sorted(DATA))
def test_malformed_data_is_refused_cleanly(case, command, tmp_path):
    files = DATA[case](tmp_path)
    assert_refused_cleanly(tmp_path, _arguments(command, files, tmp_path, True), REFUSED)


def _options_cases() -> dict[str, list[str]]:
    """Bad options and output paths on a sound model: {case: arguments}, with M the
    model, D its data, DYN a model with a dynamic batch dim and T the folder."""
    huge = str(2**40)
    return {
        "--input-shape with 2^40 elements": ["run", "DYN", "--input-shape", f"x:{huge}x4"],
        "fix-shapes to 2^40 elements": ["run", "DYN", "--passes", f"fix-shapes{{x={huge}x4}}"],
        "--seed -1 (run)": ["run", "M", "--seed", "-1"],
        "--seed -1 (check)": ["check", "M", "M", "--seed", "-1"],
        "--percentile 150": ["calibrate", "M", "--data", "D", "--percentile", "150"],
        "--percentile nan": ["calibrate", "M", "--data", "D", "--percentile", "nan"],
        "--bins 3": ["calibrate", "M", "--data", "D", "--bins", "3"],
        "--cache for TensorRT 11": ["calibrate", "M", "--data", "D", "--cache", "T/c.cache",
                                    "--trt", "11", "-o", "T/q.onnx"],
        "unknown pass": ["run", "M", "--passes", "fold-bm"],
        "unclosed brace": ["run", "M", "--passes", "fix-shapes{x=1x4"],
        "unknown pass option": ["run", "M", "--passes", "fold-constants{nope=1}"],
        "bad option value": ["run", "M", "--passes", "fold-constants{size-threshold=abc}"],
        "empty pipeline": ["run", "M", "--passes", ""],
        "double comma": ["run", "M", "--passes", "cleanup,,fold-bn"],
        "unknown provider": ["run", "M", "--providers", "tpu"],
        "bad --input-value": ["run", "M", "--input-value", "x=abc"],
        "bad --input-shape": ["run", "DYN", "--input-shape", "x:1xfoo"],
        "bad --trt": ["doctor", "M", "--trt", "banana"],
        "bad --memory-budget": ["calibrate", "M", "--data", "D", "--memory-budget", "lots"],
        "bad --mode": ["check", "M", "M", "--mode", "fuzzy"],
        "missing --data": ["run", "M", "--data", "T/none.npz"],
        "missing --plugin-rules": ["run", "M", "--plugin-rules", "T/none.py"],
        "-o onto the input": ["run", "M", "-o", "M"],
        "--report onto the input": ["run", "M", "-o", "T/o.onnx", "--report", "M"],
        "--report onto -o": ["run", "M", "-o", "T/o.onnx", "--report", "T/o.onnx"],
        "--cache onto the input": ["calibrate", "M", "--data", "D", "--cache", "M"],
        "--ranges onto the input": ["calibrate", "M", "--data", "D", "--ranges", "M"],
        "--ranges onto --data": ["calibrate", "M", "--data", "D", "--ranges", "D"],
        "check --json-out onto the input": ["check", "M", "M", "--json-out", "M"],
        "plan onto the input": ["plugins", "match", "M", "-o", "M"],
        "apply -o onto the plan": ["plugins", "apply", "M", "T/plan.yaml", "-o", "T/plan.yaml"],
        "apply a plan that is not one": ["plugins", "apply", "M", "D", "-o", "T/o.onnx"],
        "apply a missing plan": ["plugins", "apply", "M", "T/none.yaml", "-o", "T/o.onnx"],
        "--report in a missing folder": ["run", "M", "-o", "T/o.onnx", "--report",
                                         "T/nodir/r.json"],
        "--cache in a missing folder": ["calibrate", "M", "--data", "D", "-o", "T/q.onnx",
                                        "--cache", "T/nodir/c.cache"],
        "--ranges in a missing folder": ["calibrate", "M", "--data", "D", "-o", "T/q.onnx",
                                         "--ranges", "T/nodir/r.json"],
        "check --json-out in a missing folder": ["check", "M", "M", "--json-out", "T/nodir/r.json"],
        "-o is a folder": ["run", "M", "-o", "T"],
    }


@pytest.mark.parametrize("case", sorted(_options_cases()))
def test_a_bad_option_is_refused_before_any_work(case, tmp_path):
    model = good_model()
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    (tmp_path / "dyn.onnx").write_bytes(model.SerializeToString())
    good_data(tmp_path)
    (tmp_path / "plan.yaml").write_text(EMPTY_PLAN)
    names = {"M": tmp_path / "m.onnx", "D": tmp_path / "data.npz",
             "DYN": tmp_path / "dyn.onnx", "T": tmp_path}
    arguments = []
    for arg in _options_cases()[case]:
        head, _, rest = arg.partition("/")
        arguments.append(str(names[head] / rest if rest else names[head])
                         if head in names else arg)
    assert_refused_cleanly(tmp_path, arguments, REFUSED)
