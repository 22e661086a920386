"""Plugin nodes: build them typed as TensorRT's ONNX parser reads them, and validate them.

The parser imports a node it has no builtin importer for through the plugin creator named
by its op_type, `plugin_version` (STRING, default "1") and `plugin_namespace` (STRING,
default ""), and passes only the attributes whose names the creator lists, converted by
the attribute's ONNX type: INT -> kINT32, FLOAT -> kFLOAT32, INTS/FLOATS -> arrays,
STRING -> kCHAR, TENSOR by dtype (`trt_plugins.json`, `onnx_parser_plugin_rules`). A field
given the wrong ONNX type (an INT where the creator reads kFLOAT32) is read as garbage or
ignored, so every plugin node graphfix writes goes through `plugin_node`, which types each
value from the spec, and `problems`, the one validation doctor uses too.

Op types that are also ONNX ops (ScatterND, Split, ScatterElements) are written in the
domain `PLUGIN_NODE_DOMAIN`: in the default domain they would be the ONNX op, and
TensorRT's builtin importer for it (8.2+ for ScatterND) takes precedence over the plugin
anyway. TensorRT before 10.10 ignores a node's domain when it looks up a plugin (10.10+
reads the namespace from it): not verified here, where no TensorRT is installed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import onnx
import onnx.defs
import onnx_graphsurgeon as gs
from onnx import AttributeProto, TensorProto, helper

from graphfix.errors import GraphfixError
from graphfix.trt import PluginSpec, TrtTarget, plugin_attribute_rules, plugin_for

PARSER_ATTRS = ("plugin_version", "plugin_namespace")  # read by the parser, as STRING
PLUGIN_NODE_DOMAIN = "trt.plugins"  # for plugin op types that are also ONNX ops
_SPEC_TYPE = re.compile(r"(?i)(int32|float32|string|char/string)(?:\[(\w*)\])?(?=$|\s)")
_FIELD_OF_SPEC = {"int32": "kINT32", "float32": "kFLOAT32", "string": "kCHAR",
                  "char/string": "kCHAR"}


@dataclass(frozen=True)
class Field:
    """How a plugin field is written in ONNX: `kind` "int", "float" or "string"; `size` the
    number of values for an array field ("int32[2]" -> 2), None for a scalar, -1 for an
    array of any length ("float32[C]", "float32[]")."""

    kind: str
    size: int | None


def field_of(type_text: str) -> Field | None:
    """The field type of a spec's type text ("int32", "float32[C] (ONNX FLOATS or TENSOR)",
    "int32 bool 0/1 (ONNX INT)"); None when the text names no type graphfix can write."""
    match = _SPEC_TYPE.match(type_text)
    if match is None:
        return None
    kind = {"int32": "int", "float32": "float"}.get(match.group(1).lower(), "string")
    size = match.group(2)
    return Field(kind, None if size is None else int(size) if size.isdigit() else -1)


def namespace_domain(op_type: str) -> str:
    """The domain graphfix writes a plugin node in: "" unless the op type is an ONNX op."""
    return PLUGIN_NODE_DOMAIN if onnx.defs.has(op_type) else ""


def typed_attributes(spec: PluginSpec | None, values: Mapping[str, Any],
                     declared: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`values` converted to the Python types onnx writes as the parser's field types:
    int32 fields as int / list of int, float32 as float / list of float, strings as str.
    `declared` gives types ("int32", "float32[]") for fields the spec does not list (a
    user's own plugin). A value that cannot be converted is a GraphfixError."""
    types = {a.name: a.type for a in spec.attributes} if spec is not None else {}
    types.update(declared or {})
    out: dict[str, Any] = {}
    for name, value in values.items():
        field = field_of(types.get(name, ""))
        try:
            out[name] = _convert(value, field)
        except (TypeError, ValueError) as err:
            raise GraphfixError(
                f"Plugin attribute {name}={value!r} cannot be written as {types[name]}",
                str(err), "give a value of the field's type") from None
    return out


def _convert(value: Any, field: Field | None) -> Any:
    if isinstance(value, np.ndarray) and field is None:
        return value
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if field is None:  # unknown field: keep what the caller wrote
        return value.item() if isinstance(value, np.generic) else value
    cast = {"int": _int, "float": float, "string": str}[field.kind]
    if field.size is None and not isinstance(value, (list, tuple)):
        return cast(value)
    if not isinstance(value, (list, tuple)):
        value = [value]
    return [cast(v) for v in value]


def _int(value: Any) -> int:
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{value} is not an integer")
    return int(value)


def plugin_node(op_type: str, inputs: Sequence[str], outputs: Sequence[str],
                attributes: Mapping[str, Any], *, name: str, version: str | None = None,
                namespace: str = "", target: TrtTarget | None = None,
                declared: Mapping[str, str] | None = None) -> onnx.NodeProto:
    """A valid plugin node: typed attributes, `plugin_version` (the spec's newest version
    when None) and `plugin_namespace` as STRING. Raises GraphfixError naming every
    problem `problems` finds (for a plugin graphfix knows) or an unknown op type without
    `declared` fields (a user plugin declares its fields)."""
    spec = plugin_for(op_type)
    if spec is None and declared is None:
        raise GraphfixError(
            f"Unknown plugin '{op_type}'",
            "it is not a TensorRT plugin in graphfix's data (trt_plugins.json) and no rule "
            "declares its fields",
            "fix the name, or declare the plugin's attributes in your rule "
            "(see docs/plugins.md)")
    if version is None:
        version = default_version(spec, target)
    attrs = typed_attributes(spec, attributes, declared)
    attrs.update(plugin_version=str(version), plugin_namespace=str(namespace))
    node = helper.make_node(op_type, list(inputs), list(outputs), name=name,
                            domain=namespace_domain(op_type), **attrs)
    if spec is not None:
        found = problems(node, spec, target)
        if found:
            raise GraphfixError(
                f"Plugin node {op_type} '{name}' is not valid: " + "; ".join(found),
                "TensorRT's parser would pass these fields wrongly or not at all",
                "fix the attributes (graphfix plugins list shows each plugin's fields)")
    return node


def plugin_gs_node(op_type: str, inputs: Sequence[gs.Tensor], outputs: Sequence[gs.Tensor],
                   attributes: Mapping[str, Any], *, name: str, version: str | None = None,
                   namespace: str = "", target: TrtTarget | None = None,
                   declared: Mapping[str, str] | None = None) -> gs.Node:
    """`plugin_node`'s node (typed, validated: raises before anything is changed) as a
    graphsurgeon node wired to `inputs` and `outputs`; `add_to_graph` adds it."""
    proto = plugin_node(op_type, [t.name for t in inputs], [t.name for t in outputs],
                        attributes, name=name, version=version, namespace=namespace,
                        target=target, declared=declared)
    attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    return gs.Node(op_type, name, attrs, list(inputs), list(outputs),
                   domain=proto.domain or None)


def add_to_graph(graph: gs.Graph, node: gs.Node) -> gs.Node:
    """Append a plugin node to `graph`, importing its domain when it has one."""
    graph.nodes.append(node)
    if node.domain and node.domain not in {d.domain for d in graph.import_domains or ()}:
        graph.import_domains = [*(graph.import_domains or ()),
                                helper.make_opsetid(node.domain, 1)]
    return node

def default_version(spec: PluginSpec | None, target: TrtTarget | None) -> str:
    """The plugin_version to write: for a target, the oldest version not deprecated by
    then (the data does not say when each version appeared, and an older target is more
    likely to have the older one: ROIAlign_TRT v2 came with 10.1, v1 is deprecated from
    10.12); without a target, the newest. "1" when the data lists none."""
    if spec is None or not spec.versions:
        return "1"
    if target is None:
        return spec.versions[-1]
    deprecated = dict(spec.version_deprecations)
    for version in spec.versions:
        since = deprecated.get(version)
        if since is None or not target.at_least(since):
            return version
    return spec.versions[-1]


@cache
def _mapping() -> tuple[dict[str, str], dict[str, str], frozenset[str]]:
    """The parser's attribute mapping read from the data's text ("INT->kINT32, ...,
    TENSOR->by dtype (FLOAT kFLOAT32, ...; INT64/UINT8/BOOL tensors rejected)"):
    (ONNX attribute type -> field type, tensor dtype -> field type, rejected dtypes)."""
    text = str(plugin_attribute_rules().get("attribute_mapping", ""))
    by_attr = {a: f for a, f in re.findall(r"\b([A-Z]+)->(k[A-Z0-9]+)", text)}
    tensor = re.search(r"TENSOR->by dtype \(([^;)]*);?\s*([^)]*)\)", text)
    by_dtype = dict(re.findall(r"\b([A-Z0-9]+) (k[A-Z0-9]+)", tensor.group(1))) if tensor else {}
    rejected = frozenset(re.findall(r"[A-Z0-9]+", tensor.group(2).split("tensors")[0])
                         if tensor else ())
    return by_attr, by_dtype, rejected


def _given(attr: onnx.AttributeProto) -> tuple[str | None, int | None, str]:
    """(plugin field type the parser makes of `attr`, value count, problem or "")."""
    by_attr, by_dtype, rejected = _mapping()
    if not by_attr:
        return None, None, ""  # no mapping in the data: nothing to check against
    kind = AttributeProto.AttributeType.Name(attr.type)
    if attr.type == AttributeProto.TENSOR:
        dtype = TensorProto.DataType.Name(attr.t.data_type)
        if dtype in rejected:
            return None, None, f"{attr.name} is a {dtype} TENSOR, which the parser rejects"
        count = 1
        for d in attr.t.dims:
            count *= d
        return by_dtype.get(dtype), count, ""
    if kind not in by_attr:
        return None, None, f"{attr.name} is {kind}, which the parser does not pass to plugins"
    counts = {AttributeProto.INTS: len(attr.ints), AttributeProto.FLOATS: len(attr.floats)}
    return by_attr[kind], counts.get(attr.type, 1), ""


def problems(node: onnx.NodeProto, spec: PluginSpec, target: TrtTarget | None = None
             ) -> list[str]:
    """Every problem of a plugin node against its spec, in the spec's order: the input
    count, `plugin_version`/`plugin_namespace` types, the version, then each field:
    missing where required, given a type the parser converts to another field type, a
    wrong number of values, a field newer than `target` (None: any version)."""
    found: list[str] = []
    count = spec.input_count()
    given_inputs = len(node.input)
    while given_inputs and not node.input[given_inputs - 1]:
        given_inputs -= 1  # trailing "" are omitted optional inputs
    if count is not None and not count[0] <= given_inputs <= count[1]:
        want = str(count[0]) if count[0] == count[1] else f"{count[0]} to {count[1]}"
        names = ", ".join(i.name + (" (optional)" if i.optional else "") for i in spec.inputs)
        found.append(f"{given_inputs} inputs where the plugin takes {want} ({names})")
    given = {a.name: a for a in node.attribute}
    for name in PARSER_ATTRS:
        if name in given and given[name].type != AttributeProto.STRING:
            found.append(f"{name} must be a STRING attribute")
    version = given.get("plugin_version")
    if version is not None and version.type == AttributeProto.STRING and spec.versions:
        text = version.s.decode(errors="replace")
        if text not in spec.versions:
            found.append(f"plugin_version \"{text}\" is not one of the plugin's versions "
                         f"({', '.join(spec.versions)})")
    for field in spec.attributes:
        if field.name in PARSER_ATTRS:
            continue
        exists = field.since is None or target is None or target.at_least(field.since)
        attr = given.get(field.name)
        if attr is None:
            if field.required and exists:
                found.append(f"required {field.name} ({field.type}) is missing")
            continue
        if not exists:
            found.append(f"{field.name} is a field only from TensorRT {field.since}; "
                         f"TensorRT {target.effective} does not pass it to the plugin")
        made, values, problem = _given(attr)
        match = _SPEC_TYPE.match(field.type)
        if problem or match is None:
            found.extend([problem] if problem else [])
            continue
        want = _FIELD_OF_SPEC[match.group(1).lower()]
        kind = AttributeProto.AttributeType.Name(attr.type)
        if made is not None and made != want:
            found.append(f"{field.name} is {kind} (the parser passes {made}); the field is "
                         f"{field.type}")
        elif want != "kCHAR" and values is not None:
            size = match.group(2)
            wanted = 1 if size is None else int(size) if size.isdigit() else None
            if wanted is not None and values != wanted:
                found.append(f"{field.name} has {values} values; the field is {field.type}")
    return found
