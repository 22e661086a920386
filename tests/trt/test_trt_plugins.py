"""Plugin lookups and plugin status per TensorRT version (trt_plugins.json)."""

from __future__ import annotations

import pytest

from graphfix.trt import PluginAttr, parse_target, plugin_attribute_rules, plugin_for
from graphfix.trt._data import plugins_data


def test_efficient_nms_spec():
    spec = plugin_for("EfficientNMS_TRT")
    assert spec.versions == ("1",) and spec.category == "detection/NMS"
    assert (spec.deprecated_since, spec.removed_in) == ("10.12", None)
    assert spec.replacement.startswith("INMSLayer")
    required = {a.name for a in spec.attributes if a.required}
    assert required == {"score_threshold", "iou_threshold", "max_output_boxes",
                        "background_class", "score_activation", "box_coding"}
    agnostic = next(a for a in spec.attributes if a.name == "class_agnostic")
    assert agnostic == PluginAttr("class_agnostic", "int32 bool 0/1 (ONNX INT)", False, 0,
                                  agnostic.meaning, since="8.6")


@pytest.mark.parametrize(("version", "status"), [
    ("8.6", "available"), ("10.1", "available"), ("10.11", "available"),
    ("10.12", "deprecated"), ("10", "deprecated"), ("11.1", "deprecated")])
def test_efficient_nms_deprecated_since_10_12(version, status):
    assert plugin_for("EfficientNMS_TRT").status_at(parse_target(version)) == status


@pytest.mark.parametrize(("version", "status"), [
    ("8.6", "available"), ("9.3", "deprecated"), ("10.16", "deprecated"),
    ("11.0", "removed"), ("11.1", "removed")])
def test_batched_nms_deprecated_9_and_removed_11(version, status):
    # "11.0" uses the 10.16 table, but the plugin status follows the requested version.
    assert plugin_for("BatchedNMS_TRT").status_at(parse_target(version)) == status


def test_status_prose_is_read_for_its_version():
    # "10.12 (together with EfficientNMS_TRT)" and a "removed" sentence without removed_in.
    assert plugin_for("EfficientNMS_Explicit_TF_TRT").deprecated_since == "10.12"
    onnx_nms = plugin_for("EfficientNMS_ONNX_TRT")
    assert (onnx_nms.deprecated_since, onnx_nms.removed_in) == ("9.0", "11.0")


def test_per_version_deprecation_is_not_whole_plugin():
    spec = plugin_for("InstanceNormalization_TRT")
    assert spec.deprecated_since is None
    assert spec.version_deprecations == (("1", "10.3"), ("2", "10.12"))
    assert spec.status_at(parse_target("11.1")) == "available"
    qkv = plugin_for("CustomQKVToContextPluginDynamic")
    assert qkv.deprecated_since == "10.15"  # all_deprecated_since
    assert ("3", "10.4") in qkv.version_deprecations


def test_variants_listed_under_another_plugin():
    dynamic = plugin_for("BatchedNMSDynamic_TRT")
    assert dynamic.alias_of == "BatchedNMS_TRT"
    assert dynamic.status_at(parse_target("11.1")) == "removed"
    old = plugin_for("CropAndResize")  # its own line: "deprecated 9.0, removed 11.0"
    assert (old.alias_of, old.versions, old.removed_in) == ("CropAndResizeDynamic", ("1",), "11.0")
    assert plugin_for("CropAndResizeDynamic").status_at(parse_target("11.1")) == "available"


def test_trt_11_custom_ops():
    spec = plugin_for("TRT_Attention")
    assert spec.category == "trt-custom-op" and spec.added_in == "11.1"
    assert "IAttention" in spec.description
    assert spec.status_at(parse_target("11.1")) == "available"
    assert spec.status_at(parse_target("10.16")) == "unavailable"
    assert plugin_for("TRT_KVCacheUpdate") is not None


def test_lookup_is_exact():
    assert plugin_for("efficientnms_trt") is None
    assert plugin_for("EfficientNMS") is None
    assert plugin_for("NonMaxSuppression") is None


def test_every_plugin_in_the_data_is_found():
    for entry in plugins_data()["plugins"]:
        spec = plugin_for(entry["op_type"])
        assert spec is not None and spec.alias_of is None
        assert len(spec.attributes) == len(entry["attributes"])
        hash(spec)  # frozen and hashable: list defaults became tuples


def test_plugin_attribute_rules_as_in_data_and_a_copy():
    rules = plugin_attribute_rules()
    assert rules == plugins_data()["onnx_parser_plugin_rules"]
    assert "plugin_version" in rules["fallback_importer"]
    rules.clear()
    assert plugin_attribute_rules()
