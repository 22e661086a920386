"""Every module and every --help works without tensorrt installed."""

import pkgutil
import subprocess
import sys

import graphfix

SCRIPT = """
import sys, importlib, pkgutil
sys.modules["tensorrt"] = None  # makes `import tensorrt` raise ImportError
import graphfix
for mod in pkgutil.walk_packages(graphfix.__path__, "graphfix."):
    if mod.name != "graphfix.__main__":
        importlib.import_module(mod.name)
from typer.testing import CliRunner
from graphfix.cli.app import app
r = CliRunner()
for args in (["--help"], ["run", "--help"], ["passes", "--help"], ["demo", "--help"],
             ["doctor", "--help"], ["calibrate", "--help"], ["check", "--help"]):
    res = r.invoke(app, args)
    assert res.exit_code == 0, (args, res.output)
print("ok")
"""


def test_all_modules_and_help_without_tensorrt():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_every_module_is_found():
    names = {m.name for m in pkgutil.walk_packages(graphfix.__path__, "graphfix.")}
    assert {"graphfix.io", "graphfix.passes.manager", "graphfix.cli.app"} <= names
