"""opset: convert the model's default ONNX domain to another opset version.

TensorRT parses a range of opsets that depends on its version (8.0/8.2: up to 13;
8.4-8.6: up to 17; 9.3: up to 19; 10.0/10.1: 9-20; 10.15/10.16/11.1: 9-24; TensorRT
data, `onnx_trt_operators.json` `parser_behaviour_notes.opset`), so a model may
have to move. The rewrite is ONNX's own version converter, applied per node::

    Squeeze-11(x, axes=[0])            -> Squeeze-13(x, Constant([0]))
    Split-11(x, split=[2, 2])          -> Split-13(x, Constant([2, 2]))
    Upsample-9(x, scales)              -> Resize(x, roi, scales)
    Op-a(...)                          -> Op-b(...)   when nothing else changed

The graph is exported, converted, imported again, and its nodes, inputs, outputs
and opset imports move into the graph the pass was given (the pass manager holds
that object). Only the default domain changes: nodes of other domains
(com.microsoft, ai.onnx.ml, ...) are left as they are, with a note. Initializers
over `skeleton.MAX_ELEMENTS` elements do not go through the converter: they go in
as typed graph inputs and the original constants take their place afterwards, so
the converter never serializes large weights (protobuf stops at 2 GB) and the
graph keeps its own constant objects.

When the converter cannot convert (an op without an adapter between the two
versions, most downgrades), the graph is left as it was and the note names the op
and quotes the converter. The pass manager checks the numbers afterwards, as after
every pass: the converter's adapters are ONNX's, not graphfix's.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import onnx
import onnx_graphsurgeon as gs
from onnx import version_converter

from graphfix.errors import GraphfixError
from graphfix.graph import all_graphs, is_onnx, node_label, opset_of, replace_in, to_graph
from graphfix.graph.convert import export
from graphfix.graph.skeleton import skeleton
from graphfix.passes.base import Note, Pass, PassContext, PassResult

_FAILED = re.compile(r"failed:\s*(.*)$", re.S)
_OP = re.compile(r"\bfor (\w+)\b")


@dataclass(frozen=True)
class OpsetOptions:
    """`version`: the opset of the default ONNX domain to convert to."""

    version: int = 17

    def __post_init__(self) -> None:
        newest = onnx.defs.onnx_opset_version()
        if not 1 <= self.version <= newest:
            raise GraphfixError(
                f"Pass 'opset' got version={self.version}",
                f"the installed onnx knows opsets 1 to {newest}",
                "write for example opset{version=17} (TensorRT 8.4-8.6 parse up to 17)",
            )


class Opset(Pass):
    """Convert the default ONNX domain to opset `version` with onnx.version_converter.

    Handles upgrades and the downgrades the converter has adapters for, If/Loop/Scan
    bodies (the converter walks them), and graphs of any size (large weights stay
    out of the converter). Leaves other domains as they are, with a note.

    Does not apply, with a note: the graph is already at `version`; the converter
    fails (the note names the first node of the op it names and quotes it).
    """

    name = "opset"
    summary = "Convert the default ONNX domain to another opset (onnx.version_converter)"
    Options = OpsetOptions

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        current, target = opset_of(graph), self.options.version
        if current == target:
            result.notes.append(Note("graph", f"it is already at opset {target}"))
            return result
        result.notes.extend(_other_domains(graph))
        model, large = _export(graph)
        try:
            converted = version_converter.convert_version(model, target)
        except Exception as err:  # the converter raises RuntimeError, ValidationError, ...
            result.notes.append(_failure(graph, current, target, err))
            return result
        _replace_contents(graph, to_graph(converted), large)
        result.counts[f"converted opset {current} to opset {target}"] += 1
        result.changed = True
        return result


def _other_domains(graph: gs.Graph) -> list[Note]:
    """A note per non-default domain used: its nodes keep that domain's opset."""
    used: dict[str, Counter[str]] = {}
    for g in all_graphs(graph):
        for node in g.nodes:
            if not is_onnx(node):
                used.setdefault(node.domain, Counter())[node.op] += 1
    return [
        Note(domain, "its nodes are left as they are ("
             + ", ".join(f"{op} x{n}" for op, n in sorted(ops.items()))
             + "): the converter changes only the default ONNX domain")
        for domain, ops in sorted(used.items())
    ]


def _export(graph: gs.Graph) -> tuple[onnx.ModelProto, dict[str, gs.Constant]]:
    """The graph as a model for the converter, and the large constants kept out of it.

    `skeleton` turns main-graph initializers over its size limit into typed graph
    inputs; the converter never reads weights of that size (its adapters read
    small constant inputs such as axes, splits and scales).
    """
    model = export(graph)
    light = skeleton(model)
    listed = {vi.name for vi in model.graph.input}
    moved = {vi.name for vi in light.graph.input} - listed
    constants = graph.tensors()
    return light, {name: constants[name] for name in moved}


def _replace_contents(graph: gs.Graph, new: gs.Graph, large: dict[str, gs.Constant]) -> None:
    """Move `new`'s contents into `graph`; large constants come back as the same objects."""
    inputs = []
    for t in new.inputs:
        original = large.get(t.name)
        if original is None:
            inputs.append(t)
            continue
        for reader in list(t.outputs):
            replace_in(reader.inputs, t, original)
    moved = {id(t) for t in new.inputs if t.name in large}
    graph.nodes = new.nodes
    graph.inputs = inputs
    graph.outputs = [large[t.name] if id(t) in moved else t for t in new.outputs]
    graph.opset = new.opset
    graph.import_domains = new.import_domains


def _failure(graph: gs.Graph, current: int, target: int, err: Exception) -> Note:
    """The converter's error as a note on the first node of the op it names."""
    text = str(err).strip()
    match = _FAILED.search(text)
    message = (match.group(1) if match else text).strip().splitlines()[0][:300]
    op = _OP.search(message)
    subject = "graph"
    if op:
        node = next((n for g in all_graphs(graph) for n in g.nodes
                     if n.op == op.group(1) and is_onnx(n)), None)
        subject = node_label(node) if node is not None else op.group(1)
    return Note(subject, f"onnx.version_converter cannot convert opset {current} "
                         f"to opset {target}: {message}")
