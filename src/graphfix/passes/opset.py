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

The converter has no adapter for many downgrades (Split-18 and Pad-18 to 17; Add,
Mul, Relu, Reshape from 14 to 13). Where the op's newer versions only added types or
attributes and inputs whose default is the old behaviour, and the node uses none of
that, the node is held out of the conversion and comes back as it was
(`_opset_hold`); plugin nodes in the default domain are always held. What the
converter writes wrong is mended (`_repair`: Reduce* keeps noop_with_empty_axes).
When it still cannot convert, the graph is left as it was and the note names the op,
quotes the converter and says why its nodes could not be held. The pass manager
checks the numbers afterwards, as after every pass: the converter's adapters are
ONNX's, not graphfix's.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import onnx
import onnx_graphsurgeon as gs
from onnx import version_converter

from graphfix.errors import GraphfixError
from graphfix.graph import all_graphs, is_onnx, node_label, opset_of, to_graph
from graphfix.graph.convert import adopt, light_model
from graphfix.graph.protos import all_nodes
from graphfix.passes._opset_hold import (
    adapterless_op,
    hold,
    plugin_holds,
    release,
    same_meaning,
)
from graphfix.passes.base import Note, Pass, PassContext, PassResult

_FAILED = re.compile(r"failed:\s*(.*)$", re.S)
_OP = re.compile(r"\bfor (\w+)\b")


@dataclass(frozen=True)
class OpsetOptions:
    """`version`: the opset of the default ONNX domain to convert to. `to-target`: instead,
    the nearest opset the --trt target's parser reads, and only when the model's is outside
    that range (the `--trt` default pipeline uses it)."""

    version: int = 17
    to_target: bool = False

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
        current = opset_of(graph)
        target = self.options.version
        if self.options.to_target:
            target, why = _target_opset(current, ctx.trt)
            if target is None:
                result.notes.append(Note("graph", why))
                return result
        if current == target:
            result.notes.append(Note("graph", f"it is already at opset {target}"))
            return result
        result.notes.extend(_other_domains(graph))
        model, large = light_model(graph)
        held = plugin_holds(graph)
        while True:  # each round holds one more op the converter has no adapter for
            hold(model, held)
            try:
                converted = version_converter.convert_version(model, target)
                break
            except Exception as err:  # the converter raises RuntimeError, ValidationError
                op = adapterless_op(err)
                more, why = same_meaning(graph, op, current, target) if op else (None, "")
                if not more or set(more) <= set(held):
                    result.notes.append(_failure(graph, current, target, err, why))
                    return result
                held.update(more)
        release(converted, held)
        result.notes.extend(_repair(converted, target))
        adopt(graph, to_graph(converted), large)
        result.counts[f"converted opset {current} to opset {target}"] += 1
        result.changed = True
        return result


def _target_opset(current: int, trt) -> tuple[int | None, str]:
    """The opset `to-target` converts to, or None and why it does not convert."""
    if trt is None:
        return None, "no --trt target: to-target has no range to fit"
    bounds = trt.opset_range
    if bounds is None:
        return None, f"the data has no opset range for TensorRT {trt.version}"
    low, high = bounds
    if low <= current <= high:
        return None, (f"opset {current} is within the {low}-{high} that TensorRT "
                      f"{trt.version}'s parser reads (operator table)")
    return min(max(current, low), high), ""


_REDUCE_WITH_NOOP_FROM_18 = ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                             "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")


def _repair(model: onnx.ModelProto, target: int) -> list[Note]:
    """Fix what onnx.version_converter (1.23) writes wrong, in place. Its Reduce* adapter
    from 18 down moves `axes` back into the attribute but keeps `noop_with_empty_axes`,
    which those ops only have from 18 (ReduceSum from 13): onnx.checker rejects every
    PyTorch dynamo export's ReduceMean so converted. The attribute is dropped where it
    changes nothing: 0 (the default), or axes given (it only acts on empty axes)."""
    notes = []
    if target >= 18:
        return notes
    for node in all_nodes(model.graph):
        if node.domain not in ("", "ai.onnx") or node.op_type not in _REDUCE_WITH_NOOP_FROM_18:
            continue
        attrs = {a.name: a for a in node.attribute}
        noop = attrs.get("noop_with_empty_axes")
        if noop is None:
            continue
        axes = attrs.get("axes")
        if noop.i == 0 or (axes is not None and len(axes.ints) > 0):
            node.attribute.remove(noop)
        else:
            notes.append(Note(node.name or node.op_type,
                              f"noop_with_empty_axes=1 with no axes has no {node.op_type}-"
                              f"{target} form"))
    return notes


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


def _failure(graph: gs.Graph, current: int, target: int, err: Exception,
             why: str = "") -> Note:
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
    held = f"; not held out of it: {why}" if why else ""
    return Note(subject, f"onnx.version_converter cannot convert opset {current} "
                         f"to opset {target}: {message}{held}")
