"""The flags several commands share, defined once (polygraphy's argument groups).

Each function returns a fresh typer option; a command declares a shared flag only
through these, so `--trt` or `--seed` has one type, default and help text everywhere.
tests/cli/test_options.py walks every command and fails on a shared flag that differs.
The groups: model input (`input_shape`, `input_value`), data (`data`, `data_key`,
`data_loader_script`, `samples`, `seed`), target (`trt`, `fail_on`), runtime
(`providers`, `memory_budget`), rules (`plugin_rules`), output (`output`, `as_json`,
`json_out`, `html`).
"""

from __future__ import annotations

from typing import Any

import typer

from graphfix.runtime.feeds import DEFAULT_SEED

FAIL_ON = ("error", "warn", "never")


def input_shape() -> Any:
    return typer.Option(
        None, "--input-shape",
        help="Size of a dynamic input's dims for the test inputs, NAME:1x3x224x224 "
        "(repeatable; not needed with --data). Dynamic axis 0 defaults to 1; other dynamic "
        "dims must be given.")


def input_value() -> Any:
    return typer.Option(
        None, "--input-value",
        help="Fix an input's value, NAME=VALUE (repeatable): a number, or comma-separated "
        "numbers for a 1-D input, e.g. sr=16000. Broadcast to the input's shape and cast to "
        "its dtype; other inputs stay random.")


def data() -> Any:
    return typer.Option(
        None, "--data",
        help="Real inputs instead of random ones: an .npz (input name -> array with a "
        "leading sample axis), a .npy, a folder of .npy/.npz files or images (with "
        "--preprocess); float64 is cast to float32. Shapes come from the data.")


def preprocess() -> Any:
    return typer.Option(None, "--preprocess", help="For image folders: e.g. "
                        "resize=224,layout=NCHW,scale=1/255,mean=0.485/0.456/0.406,"
                        "std=0.229/0.224/0.225,bgr")


def data_key() -> Any:
    return typer.Option(None, "--data-key",
                        help="The array to use when one .npz holds several (one-input "
                        "models).")


def data_loader_script() -> Any:
    return typer.Option(None, "--data-loader-script",
                        help="file.py:func, a function yielding feed dicts {input name: "
                        "array} (this runs the script).")


def samples() -> Any:
    return typer.Option(
        None, "--samples", min=1,
        help="How many samples to use (default: calibrate every sample of the data, check "
        "3); check compares every one and reports the worst.")


def seed() -> Any:
    return typer.Option(DEFAULT_SEED, "--seed",
                        help="Seed of the random test inputs (not used with --data).")


def trt() -> Any:
    return typer.Option(
        None, "--trt", metavar="VERSION",
        help="The TensorRT version to target (8.6, 10, 10.12, 11.1 and so on). run prepares "
        "the model for it and reports what still blocks it; doctor and check diagnose for it; "
        "calibrate writes its cache header and checks the Q/DQ model for it; plugins shows "
        "and checks plugins for it. Without it, doctor and calibrate use the installed "
        "tensorrt (else doctor the newest version graphfix knows, calibrate 10.16); the "
        "others target none.")


def plugin_rules() -> Any:
    return typer.Option(
        None, "--plugin-rules",
        help="A user plugin rule file, .py (executed: it defines RULES) or .yaml; "
        "repeatable. See docs/plugins.md.")


def fail_on() -> Any:
    return typer.Option(
        "error", "--fail-on",
        help="Exit 1 when doctor findings at or above this severity remain (error: the "
        "target will not parse the model; warn; never: exit 0). run checks this only with "
        "--trt, after writing the result.")


def providers() -> Any:
    return typer.Option(
        "cpu", "--providers",
        help="onnxruntime execution providers, comma-separated in order of preference, e.g. "
        "cpu (the default) or cuda,cpu (needs onnxruntime-gpu); other providers by "
        "onnxruntime's full name.")


def memory_budget() -> Any:
    return typer.Option(None, "--memory-budget",
                        help="Activation memory one onnxruntime run may expose, e.g. 512MB, "
                        "2GB (default: from the free memory).")


def output() -> Any:
    return typer.Option(
        None, "-o", "--output",
        help="Where to write the result. Default: beside the input, <stem>.graphfix.onnx "
        "(run), <stem>.int8.onnx (calibrate), <stem>.plugins.yaml (plugins match), "
        "<stem>.plugins.onnx (plugins apply).")


def as_json() -> Any:
    return typer.Option(False, "--json",
                        help="Print the result as JSON on standard output (messages go to "
                        "standard error).")


def json_out() -> Any:
    return typer.Option(None, "--json-out", metavar="FILE",
                        help="Also write the result's JSON (what --json prints) to FILE.")


def html() -> Any:
    return typer.Option(None, "--html", metavar="FILE",
                        help="Write a self-contained HTML report to FILE (plots and "
                        "tables; opens offline in any browser).")


def check_fail_on(value: str) -> None:
    """--fail-on must be a severity (a usage error before any work)."""
    from graphfix.errors import GraphfixError

    if value not in FAIL_ON:
        raise GraphfixError(f"--fail-on {value!r} is not a severity",
                            "the command exits 1 when a doctor finding at or above it "
                            "remains", f"use one of: {', '.join(FAIL_ON)}")
