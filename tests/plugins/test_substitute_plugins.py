"""substitute-plugins: built-in rules per target, spec-valid plugin nodes, the numerical check
through the plugins' reference forms, user rules (.py, YAML), the match/apply plan, errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from pluginhelpers import USER_PY
from typer.testing import CliRunner

from graphfix import api
from graphfix.cli.app import app
from graphfix.errors import GraphfixError
from graphfix.plugins.nodes import plugin_node, problems
from graphfix.plugins.plan import apply_plan, match, read
from graphfix.plugins.substitute import builtin_rules
from graphfix.plugins.user import load_rules
from graphfix.runtime import references
from graphfix.trt import parse_target, plugin_for

RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=17, domains=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=imports)


def _vi(name, shape, dtype=TP.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def roialign():
    rois = np.array([[1, 1, 9, 9], [0, 2, 12, 14], [3, 3, 7, 11]], np.float32)
    return _model([helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], name="roi",
                                    output_height=3, output_width=3, sampling_ratio=2,
                                    spatial_scale=0.5)],
                  [_vi("x", [2, 4, 16, 16])], [_vi("y", None)],
                  [numpy_helper.from_array(rois, "rois"),
                   numpy_helper.from_array(np.array([0, 1, 1], np.int64), "idx")], opset=16)


def decomposed_groupnorm(groups=2, channels=4):
    inits = [numpy_helper.from_array(np.array([0, groups, -1], np.int64), "shape1"),
             numpy_helper.from_array(np.ones(groups, np.float32), "ones"),
             numpy_helper.from_array(np.zeros(groups, np.float32), "zeros"),
             numpy_helper.from_array(RNG.standard_normal((channels, 1, 1)).astype(np.float32),
                                     "gamma"),
             numpy_helper.from_array(RNG.standard_normal((channels, 1, 1)).astype(np.float32),
                                     "beta")]
    nodes = [helper.make_node("Shape", ["x"], ["xshape"], name="shape"),
             helper.make_node("Reshape", ["x", "shape1"], ["r1"], name="r1"),
             helper.make_node("InstanceNormalization", ["r1", "ones", "zeros"], ["n"],
                              name="inorm", epsilon=1e-5),
             helper.make_node("Reshape", ["n", "xshape"], ["r2"], name="r2"),
             helper.make_node("Mul", ["r2", "gamma"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "beta"], ["y"], name="add")]
    return _model(nodes, [_vi("x", [2, channels, 5, 6])], [_vi("y", None)], inits)


def deformconv():
    w = RNG.standard_normal((6, 4, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    return _model([helper.make_node("DeformConv", ["x", "w", "off", "b", "mask"], ["y"],
                                    name="dcn", pads=[1, 1, 1, 1], kernel_shape=[3, 3])],
                  [_vi("x", [1, 4, 8, 8]), _vi("off", [1, 18, 8, 8]), _vi("mask", [1, 9, 8, 8])],
                  [_vi("y", None)], [numpy_helper.from_array(w, "w"),
                                     numpy_helper.from_array(b, "b")], opset=19)


def scatternd():
    idx = numpy_helper.from_array(np.array([[0], [2]], np.int64), "idx")
    return _model([helper.make_node("ScatterND", ["x", "idx", "u"], ["y"], name="scatter")],
                  [_vi("x", [4, 3]), _vi("u", [2, 3])], [_vi("y", None)], [idx])


CASES = {"RoiAlign": (roialign, "8.4", ["ROIAlign_TRT"]),
         "decomposed GroupNorm": (decomposed_groupnorm, "8.4", ["GroupNormalizationPlugin"]),
         "DeformConv": (deformconv, "8.4", ["ModulatedDeformConv2d"]),
         # the table lists ScatterND from 8.2 (builtin importer): only 8.0 needs the plugin
         "ScatterND": (scatternd, "8.0", ["Cast", "ScatterND"])}


def _pass(pipeline="substitute-plugins"):
    return pipeline


@pytest.mark.parametrize("case", list(CASES))
def test_substitution_at_an_old_target_is_spec_valid_and_checked(case):
    build, trt, ops = CASES[case]
    model = build()
    result = api.run(model, _pass(), trt=trt)
    record = result.report.passes[0]
    assert record.status == "applied", record.to_json()
    assert result.report.check.enabled  # checked through the plugins' reference forms
    out = result.model
    assert [n.op_type for n in out.graph.node] == ops
    plugin = out.graph.node[-1]
    assert problems(plugin, plugin_for(plugin.op_type), parse_target(trt)) == []
    onnx.checker.check_model(references.substitute(out).model, full_check=True)
    feeds = {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
             .astype(np.float32) for i in model.graph.input}
    sub = references.substitute(out)
    assert not sub.not_checkable
    want = references.run(references.substitute(model), feeds)
    got = references.run(sub, feeds)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)
    again = api.run(out, _pass(), trt=trt)
    assert again.report.passes[0].status == "unchanged"


@pytest.mark.parametrize("case", list(CASES))
def test_nothing_substituted_where_the_target_parses_the_op(case):
    build, _, _ = CASES[case]
    model = build()
    result = api.run(model, _pass(), trt="11.1")
    record = result.report.passes[0]
    assert record.status == "unchanged"
    assert [n.op_type for n in result.model.graph.node] == [n.op_type for n in model.graph.node]
    assert any("parses" in str(n) and "natively" in str(n) for n in record.notes), record.notes


def test_roialign_attributes_as_the_parser_maps_them():
    out = api.run(roialign(), _pass(), trt="8.4", check=False).model
    attrs = {a.name: helper.get_attribute_value(a) for a in out.graph.node[0].attribute}
    assert attrs == {"coordinate_transformation_mode": 1, "mode": 1, "output_height": 3,
                     "output_width": 3, "sampling_ratio": 2, "spatial_scale": 0.5,
                     "plugin_version": b"1", "plugin_namespace": b""}
    types = {a.name: a.type for a in out.graph.node[0].attribute}
    assert types["spatial_scale"] == onnx.AttributeProto.FLOAT
    assert types["output_height"] == onnx.AttributeProto.INT


def test_the_plugin_version_follows_the_target():
    v = {}
    for trt in ("8.4", "10.16"):
        node = api.run(roialign(), "substitute-plugins{force=true}", trt=trt,
                       check=False).model.graph.node[0]
        v[trt] = helper.get_attribute_value(
            next(a for a in node.attribute if a.name == "plugin_version"))
    assert v == {"8.4": b"1", "10.16": b"2"}  # v1 deprecated from 10.12


def test_decomposed_groupnorm_is_a_speed_choice_not_needed_to_parse():
    result = api.run(decomposed_groupnorm(), "substitute-plugins{needed-only=true}", trt="8.4",
                     check=False)
    assert result.report.passes[0].status == "unchanged"
    assert any("speed choice" in str(n) for n in result.report.passes[0].notes)


def test_plugin_node_types_values_and_rejects_what_the_spec_forbids():
    node = plugin_node("ROIAlign_TRT", ["x", "r", "i"], ["y"], {"spatial_scale": 1,
                                                              "output_height": 7.0}, name="n")
    kinds = {a.name: a.type for a in node.attribute}
    assert kinds["spatial_scale"] == onnx.AttributeProto.FLOAT
    assert kinds["output_height"] == onnx.AttributeProto.INT
    with pytest.raises(GraphfixError, match="Unknown plugin 'NoSuch_TRT'"):
        plugin_node("NoSuch_TRT", ["x"], ["y"], {}, name="n")
    with pytest.raises(GraphfixError, match="2 inputs where the plugin takes 3"):
        plugin_node("ROIAlign_TRT", ["x", "r"], ["y"], {}, name="n")
    with pytest.raises(GraphfixError, match="required type_id"):
        plugin_node("CustomGeluPluginDynamic", ["x"], ["y"], {}, name="n")
    with pytest.raises(GraphfixError, match="cannot be written as int32"):
        plugin_node("ROIAlign_TRT", ["x", "r", "i"], ["y"], {"output_height": 2.5}, name="n")


# ----------------------------------------------------------------------------- user rules


USER_YAML = {"rules": [{"name": "myop-to-plugin", "match": {"op": "MyOp", "domain": "my.ops"},
                        "plugin": "MyPlugin_TRT", "fields": {"alpha": "float32", "size": "int32"},
                        "attributes": {"alpha": {"from": "alpha", "default": 0.5}, "size": 3}}]}


def custom_op_model():
    return _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                   helper.make_node("MyOp", ["r"], ["y"], name="mine", domain="my.ops",
                                    alpha=0.25)],
                  [_vi("x", [2, 3])], [_vi("y", None)], domains=["my.ops"])


@pytest.fixture(params=["py", "yaml"])
def rule_file(request, tmp_path):
    path = tmp_path / f"rules.{request.param}"
    path.write_text(USER_PY if request.param == "py" else yaml.safe_dump(USER_YAML))
    return path


def test_user_rule_from_file_via_pass_option_and_api(rule_file):
    for kwargs in ({"passes": f"substitute-plugins{{rules={rule_file}}}"},
                   {"passes": "substitute-plugins", "plugin_rules": [rule_file]}):
        result = api.run(custom_op_model(), trt="10.16", check=False, **kwargs)
        node = result.model.graph.node[-1]
        assert (node.op_type, node.domain) == ("MyPlugin_TRT", "")
        attrs = {a.name: (a.type, helper.get_attribute_value(a)) for a in node.attribute}
        assert attrs["alpha"] == (onnx.AttributeProto.FLOAT, 0.25)
        assert attrs["size"] == (onnx.AttributeProto.INT, 3)
        assert attrs["plugin_version"] == (onnx.AttributeProto.STRING, b"1")


def test_an_unedited_plan_applies_to_the_model_the_pass_makes(rule_file, tmp_path):
    model = custom_op_model()
    rules = builtin_rules() + load_rules(rule_file)
    target = parse_target("10.16")
    plan = match(model, rules, target)
    path = tmp_path / "plan.yaml"
    path.write_text(plan.to_yaml())
    applied, done = apply_plan(model, read(path), rules, target)
    by_pass = api.run(model, "substitute-plugins", trt="10.16", check=False,
                      plugin_rules=[rule_file]).model
    assert done == ["myop-to-plugin: mine -> MyPlugin_TRT"]
    assert [(n.op_type, sorted(str(a) for a in n.attribute)) for n in applied.graph.node] == \
        [(n.op_type, sorted(str(a) for a in n.attribute)) for n in by_pass.graph.node]


def test_an_edited_plan_changes_the_attribute(tmp_path):
    model = roialign()
    rules = builtin_rules(16)
    plan = match(model, rules, parse_target("8.4"))
    plan.entries[0]["attributes"]["sampling_ratio"] = 4
    out, _ = apply_plan(model, plan, rules, parse_target("8.4"))
    attrs = {a.name: helper.get_attribute_value(a) for a in out.graph.node[0].attribute}
    assert attrs["sampling_ratio"] == 4


# ----------------------------------------------------------------------------- errors

runner = CliRunner()


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_cli_errors_exit_2_and_leave_the_input_alone(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(roialign(), src)
    before = src.read_bytes()
    raising = tmp_path / "bad.py"
    raising.write_text("raise RuntimeError('boom')\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump({"rules": [{"name": "x", "match": {"op": "MyOp"},
                                                  "plugin": "NoSuchPlugin"}]}))
    res = _cli("run", src, "-o", tmp_path / "o.onnx", "--trt", "8.4", "--plugin-rules", raising)
    assert res.exit_code == 2 and "raised RuntimeError: boom" in res.output
    res = _cli("plugins", "match", src, "-o", tmp_path / "p.yaml", "--plugin-rules", unknown)
    assert res.exit_code == 2 and "unknown plugin 'NoSuchPlugin'" in res.output
    plan = tmp_path / "plan.yaml"
    assert _cli("plugins", "match", src, "-o", plan, "--trt", "8.4").exit_code == 0
    data = yaml.safe_load(plan.read_text())
    data["substitutions"][0]["nodes"] = ["gone"]
    plan.write_text(yaml.safe_dump(data))
    res = _cli("plugins", "apply", src, plan, "-o", tmp_path / "o.onnx")
    assert res.exit_code == 2 and "names node 'gone', which does not exist" in res.output
    data["substitutions"][0]["nodes"] = ["roi"]
    data["substitutions"][0]["attributes"]["output_height"] = "tall"
    plan.write_text(yaml.safe_dump(data))
    res = _cli("plugins", "apply", src, plan, "-o", tmp_path / "o.onnx")
    assert res.exit_code == 2 and "output_height='tall' cannot be written as int32" in res.output
    assert src.read_bytes() == before and not (tmp_path / "o.onnx").exists()


def test_run_with_trt_exits_1_while_the_target_cannot_parse_the_result(tmp_path):
    src = tmp_path / "m.onnx"
    node = helper.make_node("NonZero", ["x"], ["y"], name="nz")  # no lowering, no plugin
    onnx.save(_model([node], [_vi("x", [2, 3])], [_vi("y", None, TP.INT64)]), src)
    res = _cli("run", src, "-o", tmp_path / "o.onnx", "--trt", "8.4")
    assert res.exit_code == 1 and "--fail-on never" in res.output
    assert (tmp_path / "o.onnx").exists()
    res = _cli("run", src, "-o", tmp_path / "o2.onnx", "--trt", "8.4", "--fail-on", "never")
    assert res.exit_code == 0


def test_run_with_trt_alone_makes_a_roialign_model_doctor_accepts(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(roialign(), src)
    res = _cli("run", src, "-o", tmp_path / "o.onnx", "--trt", "8.4")
    assert res.exit_code == 0, res.output
    res = _cli("doctor", tmp_path / "o.onnx", "--trt", "8.4", "--no-parser")
    assert res.exit_code == 0, res.output


def test_match_reads_roialign_defaults_by_the_models_opset(tmp_path):
    """RoiAlign-10 has no coordinate_transformation_mode: the plugin gets 0 (no shift),
    as the parser maps it; from opset 16 the default is half_pixel (1)."""
    for opset, want in ((13, 0), (16, 1)):
        model = roialign()
        model.opset_import[0].version = opset
        src, plan = tmp_path / f"m{opset}.onnx", tmp_path / f"p{opset}.yaml"
        onnx.save(model, src)
        assert _cli("plugins", "match", src, "-o", plan, "--trt", "8.4").exit_code == 0
        attrs = yaml.safe_load(plan.read_text())["substitutions"][0]["attributes"]
        assert attrs["coordinate_transformation_mode"] == want


def test_plugins_list_names_rules_and_whether_each_plugin_is_checkable():
    res = _cli("plugins", "list", "--trt", "8.4", "--json")
    assert res.exit_code == 0
    data = __import__("json").loads(res.output)
    rules = {r["rule"]: r["at_target"] for r in data["rules"]}
    assert rules["roialign-to-plugin"] == "applies"
    assert rules["scatternd-to-plugin"] == "not needed (native)"
    specs = {s["plugin"]: s for s in data["plugins"]}
    assert specs["ROIAlign_TRT"]["reference"] and not specs["Region_TRT"]["reference"]


# ------------------------------------------------- lowering or plugin: lower-unsupported's notes


def _notes(result) -> dict[str, str]:
    """The run's notes ("subject: reason" in the report) by subject."""
    return dict(n.split(": ", 1) for r in result.report.passes for n in r.notes)


def test_an_op_lower_unsupported_leaves_names_the_plugin_that_replaces_it():
    result = api.run(roialign(), "lower-unsupported", trt="8.4", check=False)
    assert "RoiAlign" in [n.op_type for n in result.model.graph.node]
    assert _notes(result)["RoiAlign 'roi'"] == (
        "TensorRT 8.4 does not parse it, and graphfix has no exact lowering for it; "
        "substitute-plugins replaces it by the plugin ROIAlign_TRT (rule roialign-to-plugin), "
        "as the default --trt pipeline does after this pass")
    # ... and the default --trt pipeline does
    done = api.run(roialign(), trt="8.4", check=False).model
    assert [n.op_type for n in done.graph.node] == ["ROIAlign_TRT"]


def test_a_run_s_user_rule_is_offered_for_an_op_without_a_lowering(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"rules": [{
        "name": "hardmax-to-plugin", "match": {"op": "Hardmax"}, "plugin": "Hardmax_TRT",
        "fields": {"axis": "int32"}, "attributes": {"axis": {"from": "axis", "default": -1}}}]}))
    model = _model([helper.make_node("Hardmax", ["x"], ["y"], name="hm")], [_vi("x", [2, 5])],
                   [_vi("y", None)], opset=13)
    result = api.run(model, "lower-unsupported", trt="8.6", check=False, plugin_rules=[path])
    assert _notes(result)["Hardmax 'hm'"].endswith(
        "substitute-plugins replaces it by the plugin Hardmax_TRT (rule hardmax-to-plugin), "
        "as the default --trt pipeline does after this pass")


def test_a_lowered_op_says_why_not_the_plugin_and_the_advice_gives_the_plugin():
    x = RNG.standard_normal((2, 6, 3, 5)).astype(np.float32)
    model = _model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn",
                                     num_groups=2, epsilon=1e-4)],
                   [_vi("x", list(x.shape))], [_vi("y", list(x.shape))],
                   [numpy_helper.from_array(np.array([1.5, 0.5], np.float32), "s"),
                    numpy_helper.from_array(np.array([0.1, -0.2], np.float32), "b")], opset=18)
    lowered = api.run(model, "lower-unsupported", trt="8.4", check=False)
    assert "GroupNormalization" not in [n.op_type for n in lowered.model.graph.node]
    notes = [n for r in lowered.report.passes for n in r.notes]
    assert any(n.startswith("graph: GroupNormalization: lowered to ONNX ops rather than "
                            "replaced by the plugin GroupNormalizationPlugin") for n in notes)
    advice = "substitute-plugins{force=true,select=groupnorm-to-plugin},lower-unsupported"
    plugin = api.run(model, advice, trt="8.4").model  # checked through its reference form
    assert [n.op_type for n in plugin.graph.node] == ["GroupNormalizationPlugin"]
