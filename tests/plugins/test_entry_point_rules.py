"""Plugin rules from an installed package's `graphfix.plugin_rules` entry points: found by
importlib.metadata on sys.path (a real dist-info, not a mock), used by substitute-plugins
and `graphfix plugins list`, and a broken entry point is the user's error (exit 2)."""

from __future__ import annotations

import sys

import onnx
import pytest
from onnx import TensorProto, helper
from pluginhelpers import USER_PY
from typer.testing import CliRunner

from graphfix import api
from graphfix.cli.app import app
from graphfix.errors import GraphfixError
from graphfix.plugins.user import ENTRY_POINT_GROUP, all_rules, entry_point_rules

runner = CliRunner()

MODULE = USER_PY + '''
def rules():
    return RULES

def broken():
    raise RuntimeError("no licence")

NOT_RULES = ["a string"]
'''


def install(tmp_path, monkeypatch, module: str, entries: dict[str, str]) -> None:
    """A distribution `gfx-ep-test` on sys.path whose entry points in graphfix's group are
    `entries` (name -> "module:attr"), with `module` as its code."""
    (tmp_path / f"{module}.py").write_text(MODULE)
    info = tmp_path / "gfx_ep_test-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gfx-ep-test\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)


def model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("MyOp", ["r"], ["y"], name="mine", domain="my.ops", alpha=0.25)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("my.ops", 1)])


@pytest.mark.parametrize("target", ["rules", "RULES"])  # a function, or a list
def test_an_installed_entry_point_supplies_rules(tmp_path, monkeypatch, target):
    install(tmp_path, monkeypatch, f"gfx_ep_{target.lower()}", {"mine": f"gfx_ep_"
                                                                f"{target.lower()}:{target}"})
    rules = entry_point_rules()
    assert [r.name for r in rules] == ["myop-to-plugin"]
    assert rules[0].source.startswith("entry point mine (")
    assert [r.name for r in all_rules(17)][-1] == "myop-to-plugin"

    result = api.run(model(), "substitute-plugins", trt="10.16", check=False)
    node = result.model.graph.node[-1]
    assert (node.op_type, node.domain) == ("MyPlugin_TRT", "")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"alpha": pytest.approx(0.25), "size": 3, "plugin_version": b"1",
                     "plugin_namespace": b""}

    listed = runner.invoke(app, ["plugins", "list"])
    assert listed.exit_code == 0, listed.output
    assert "myop-to-plugin" in listed.output


@pytest.mark.parametrize("attr, says", [
    ("broken", "raised RuntimeError: no licence"),
    ("NOT_RULES", "are not a list of Rule"),
    ("absent_name", "cannot be loaded"),
])
def test_a_broken_entry_point_is_the_users_error(tmp_path, monkeypatch, attr, says):
    module = f"gfx_ep_bad_{attr.lower()}"
    install(tmp_path, monkeypatch, module, {"bad": f"{module}:{attr}"})
    with pytest.raises(GraphfixError, match=says) as err:
        entry_point_rules()
    assert "entry point bad" in str(err.value)

    path = tmp_path / "m.onnx"
    onnx.save(model(), path)
    before = path.read_bytes()
    out = tmp_path / "out.onnx"
    result = runner.invoke(app, ["run", str(path), "--passes", "substitute-plugins", "--trt",
                                 "10.16", "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert "entry point bad" in " ".join(result.output.split())
    assert not out.exists() and path.read_bytes() == before
