"""TensorRT OSS plugins as ONNX custom ops, and their status per TensorRT version.

Facts come from trt_plugins.json (45 plugins of NVIDIA/TensorRT `plugin/`, up to OSS
11.1). The ONNX parser imports any node it has no builtin importer for as a plugin,
looked up by op_type, attribute `plugin_version` (default "1") and `plugin_namespace`;
see `plugin_attribute_rules()`.

Status strings in the data are prose ("10.12 (together with EfficientNMS_TRT)",
"11.0 (CHANGELOG 11.0: ...)"); the first version number in them is the one used.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from graphfix.trt._data import leading_version, operators_data, plugins_data
from graphfix.trt.matrix import TrtTarget

Status = Literal["available", "deprecated", "removed", "unavailable"]

# Custom ops of the TensorRT 11.1 parser docs (TRT_Attention, ...): documented there only.
CUSTOM_OP_CATEGORY = "trt-custom-op"
_CUSTOM_OPS_FROM = "11.1"
_PER_VERSION = re.compile(r"v(\d+)(?:_(\d+))?_deprecated_since")
_VARIADIC = re.compile(r"\.\.|\sx\d|\*")  # "feature_map_0..3", "feature_maps x5"
_ALIAS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class PluginAttr:
    """One plugin field as an ONNX attribute. `required` is True only where the data
    says so; `default` is None where it gives none (list defaults become tuples)."""

    name: str
    type: str  # as in the data, e.g. "float32 (ONNX FLOAT)", "int32[2]", "" when unknown
    required: bool
    default: object | None
    meaning: str
    since: str | None = None  # TensorRT version that added the field, when the data says


@dataclass(frozen=True)
class PluginInput:
    """One plugin input as the data lists it. `variadic` when the entry stands for several
    tensors ("feature_map_0..3", "feature_maps x5"): the count is then not checked."""

    name: str
    optional: bool = False
    variadic: bool = False


@dataclass(frozen=True)
class PluginSpec:
    """A plugin an ONNX node can name in its op_type.

    `deprecated_since` and `removed_in` concern the whole plugin; deprecations of single
    plugin versions ("v1 deprecated since 10.3" while v2 is current) are in
    `version_deprecations` as (plugin_version, since) pairs. `alias_of` names the spec
    this one was derived from when the data lists the op_type under another plugin
    (BatchedNMSDynamic_TRT under BatchedNMS_TRT). `added_in` is set only for the
    TensorRT 11.1 custom ops, whose only source is the 11.1 documentation; for OSS
    plugins the data does not say when each appeared.
    """

    op_type: str
    versions: tuple[str, ...]  # plugin versions; () where the data lists none
    category: str
    description: str
    attributes: tuple[PluginAttr, ...]
    deprecated_since: str | None
    removed_in: str | None
    replacement: str  # native replacement per the data; "" when none
    version_deprecations: tuple[tuple[str, str], ...] = ()
    added_in: str | None = None
    alias_of: str | None = None
    interface: str = ""  # the TensorRT plugin interface, e.g. "IPluginV2DynamicExt"
    inputs: tuple[PluginInput, ...] = ()  # () where the data lists none

    def input_count(self) -> tuple[int, int] | None:
        """(fewest, most) inputs a node may have; None when the data lists no inputs or
        one entry stands for several tensors."""
        if not self.inputs or any(i.variadic for i in self.inputs):
            return None
        return sum(not i.optional for i in self.inputs), len(self.inputs)

    def status_at(self, target: TrtTarget) -> Status:
        """"removed", "deprecated" or "available" at the target's version.

        "unavailable" is returned only for specs with `added_in` (the TensorRT 11.1
        custom ops) when the target is older. "available" means "not marked deprecated
        or removed by then", not proof that the plugin already existed in that version.
        """
        if self.removed_in and target.at_least(self.removed_in):
            return "removed"
        if self.deprecated_since and target.at_least(self.deprecated_since):
            return "deprecated"
        if self.added_in and not target.at_least(self.added_in):
            return "unavailable"
        return "available"


def plugin_for(op_type: str) -> PluginSpec | None:
    """The plugin named exactly `op_type` ("EfficientNMS_TRT"), else None.

    Some legacy plugins share their name with an ONNX op (Split, ScatterND,
    ScatterElements): ask about nodes outside the ai.onnx domain, or about ops the
    operator table does not cover, or a standard Split will look like a plugin.

    Also matched: op types the data lists as another plugin's variant ("also":
    BatchedNMSDynamic_TRT, NMSDynamic_TRT, CropAndResize), and the TensorRT 11.1
    custom ops of `trt_custom_ops_11_1` (TRT_Attention, TRT_QuantizedAttention,
    TRT_KVCacheUpdate) as specs of category "trt-custom-op" with `added_in` "11.1",
    no attributes (the data describes them in one paragraph, kept as `description`).
    """
    return _specs().get(op_type)


def all_specs() -> dict[str, PluginSpec]:
    """Every plugin spec by op type (`plugin_for` of each); a copy."""
    return dict(_specs())


NMS_CATEGORY = "detection/NMS"


def is_nms_plugin(op_type: str) -> bool:
    """Whether `op_type` names a plugin the data files under "detection/NMS"
    (EfficientNMS_TRT, BatchedNMS(Dynamic)_TRT, NMS(Dynamic)_TRT, ...)."""
    spec = plugin_for(op_type)
    return spec is not None and spec.category == NMS_CATEGORY


def plugin_attribute_rules() -> dict[str, Any]:
    """The data's `onnx_parser_plugin_rules` (fallback importer, attribute type
    mapping, INT32-only plugins, plugins the parser inserts itself); a copy."""
    return copy.deepcopy(plugins_data()["onnx_parser_plugin_rules"])


@cache
def _specs() -> dict[str, PluginSpec]:
    specs: dict[str, PluginSpec] = {}
    for entry in plugins_data()["plugins"]:
        spec = _spec(entry)
        specs[spec.op_type] = spec
    for entry in plugins_data()["plugins"]:
        alias = _alias(entry, specs[entry["op_type"]])
        if alias is not None and alias.op_type not in specs:
            specs[alias.op_type] = alias
    for name, text in operators_data().get("trt_custom_ops_11_1", {}).get("ops", {}).items():
        specs.setdefault(name, PluginSpec(
            op_type=name, versions=(), category=CUSTOM_OP_CATEGORY, description=text,
            attributes=(), deprecated_since=None, removed_in=None, replacement="",
            added_in=_CUSTOM_OPS_FROM,
        ))
    return specs


def _spec(entry: dict[str, Any]) -> PluginSpec:
    status = entry.get("status") or {}
    return PluginSpec(
        op_type=entry["op_type"],
        versions=tuple(str(v) for v in entry.get("versions") or ()),
        category=entry.get("category", ""),
        description=entry.get("description", ""),
        interface=entry.get("interface", "") or "",
        attributes=tuple(_attr(a) for a in entry.get("attributes", ())),
        deprecated_since=leading_version(
            status.get("deprecated_since") or status.get("all_deprecated_since")),
        removed_in=leading_version(status.get("removed_in") or status.get("removed")),
        replacement=status.get("replacement") or status.get("native_replacement") or "",
        version_deprecations=_version_deprecations(status, entry["op_type"]),
        inputs=tuple(PluginInput(i["name"], bool(i.get("optional", False)),
                                 bool(_VARIADIC.search(i["name"])))
                     for i in entry.get("inputs") or ()),
    )


def _attr(entry: dict[str, Any]) -> PluginAttr:
    default = entry.get("default")
    return PluginAttr(
        name=entry["name"],
        type=entry.get("type", ""),
        required=bool(entry.get("required", False)) and not entry.get("optional", False),
        default=tuple(default) if isinstance(default, list) else default,
        meaning=entry.get("meaning", ""),
        since=entry.get("since"),
    )


def _version_deprecations(status: dict[str, Any], op_type: str) -> tuple[tuple[str, str], ...]:
    """(plugin_version, since) pairs from the status lines about single versions:
    "v1_3_deprecated_since": "10.4/10.5 (...)" -> ("1", "10.4"), ("2", "10.4"), ("3", "10.4");
    "CropAndResizeDynamic_v1": "deprecated 10.11" -> ("1", "10.11")."""
    pairs: list[tuple[str, str]] = []
    for key, text in status.items():
        if not isinstance(text, str):
            continue
        match = _PER_VERSION.fullmatch(key)
        since = leading_version(text)
        if match is not None and since is not None:
            first, last = int(match.group(1)), int(match.group(2) or match.group(1))
            pairs.extend((str(v), since) for v in range(first, last + 1))
        elif key.startswith(f"{op_type}_v") and key[len(op_type) + 2:].isdigit():
            deprecated, _ = _deprecated_removed(text)
            if deprecated:
                pairs.append((key[len(op_type) + 2:], deprecated))
    return tuple(pairs)


def _alias(entry: dict[str, Any], parent: PluginSpec) -> PluginSpec | None:
    """The spec of the op type in the entry's "also" text ("BatchedNMSDynamic_TRT (same
    creator fields; ...)"). When the status has its own "<alias>_v1" line
    ("deprecated 9.0, removed 11.0") that line decides its status."""
    also = entry.get("also")
    match = _ALIAS.match(also) if isinstance(also, str) else None
    if match is None:
        return None
    name = match.group(0)
    own = _named_version_status(entry.get("status") or {}, name)
    deprecated, removed = own if own is not None else (parent.deprecated_since, parent.removed_in)
    versions = tuple(re.findall(r"\bv(\d+)\b", also)) or parent.versions  # "(v1, ...)"
    return dataclasses.replace(
        parent, op_type=name, alias_of=parent.op_type, versions=versions,
        deprecated_since=deprecated,
        removed_in=removed,
        version_deprecations=() if own is not None else parent.version_deprecations,
        description=f"{also}. Listed under {parent.op_type}: {parent.description}",
    )


def _named_version_status(
    status: dict[str, Any], name: str
) -> tuple[str | None, str | None] | None:
    """("9.0", "11.0") from {"<name>_v1": "deprecated 9.0, removed 11.0"}; None if absent."""
    for key, text in status.items():
        if key.startswith(f"{name}_v") and isinstance(text, str):
            return _deprecated_removed(text)
    return None


def _deprecated_removed(text: str) -> tuple[str | None, str | None]:
    """"deprecated 9.0, removed 11.0" -> ("9.0", "11.0")."""
    deprecated = re.search(r"deprecated\D*?(\d+(?:\.\d+)*)", text)
    removed = re.search(r"removed\D*?(\d+(?:\.\d+)*)", text)
    return (deprecated.group(1) if deprecated else None, removed.group(1) if removed else None)
