"""The shipped data files, and that graphfix.trt never imports tensorrt unasked."""

from __future__ import annotations

import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest

from graphfix.trt._data import OPERATORS_FILE, PLUGINS_FILE

# ../shared beside the checkout, found the way tests/conftest.py finds ../shared/models.
SHARED_TRT = Path(__file__).resolve().parents[3] / "shared" / "trt"


@pytest.mark.parametrize("name", [OPERATORS_FILE, PLUGINS_FILE])
def test_packaged_copy_equals_shared(name):
    shared = SHARED_TRT / name
    if not shared.exists():
        pytest.skip(f"{shared} is not available")
    packaged = files("graphfix.trt") / "data" / name
    assert packaged.read_bytes() == shared.read_bytes()


SPY = """
import sys
attempts = []

class Spy:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorrt":
            attempts.append(name)
        return None

sys.meta_path.insert(0, Spy())
import graphfix.trt as trt
from graphfix.trt import parser

target = trt.parse_target("10.12")
target.op("NonZero"), target.opset_range, trt.plugin_for("EfficientNMS_TRT").status_at(target)
trt.parse_error_message("In node 3 (importTopK): UNSUPPORTED_NODE: x")
assert not attempts and "tensorrt" not in sys.modules, attempts
trt.parse_target(None)  # the one call that may look for tensorrt
assert attempts == ["tensorrt"], attempts
print("ok")
"""


def test_importing_graphfix_trt_does_not_import_tensorrt():
    out = subprocess.run([sys.executable, "-c", SPY], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
