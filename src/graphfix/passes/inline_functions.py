"""`inline-functions`: replace calls of model-local ONNX functions by their bodies.

PyTorch writes model-local functions with `export_modules_as_functions` (a module
class becomes a FunctionProto, each instance a node calling it), and other exporters
for ops ONNX defines as functions of their own domain. TensorRT's ONNX parser before
9.0 does not read model-local functions (doctor: `custom-op-unknown`), and graphfix's
passes do not look inside function bodies: a BatchNormalization in a function is
never folded. Inlined, every pass sees every node.

The inlining is ONNX's own (`onnx.inliner.inline_local_functions`): attribute
references are resolved, the body's names made unique per call, nested functions
inlined. It runs on the model without its large weights (`graph.convert.light_model`),
which stay the same objects. A function whose default-domain opset differs from the
model's is inlined with ONNX's version converter (`convert_version=True`); where that
fails, the pass changes nothing and says why.
"""

from __future__ import annotations

from collections import Counter

import onnx_graphsurgeon as gs

from graphfix.graph import all_graphs, to_graph
from graphfix.graph.convert import adopt, light_model
from graphfix.passes.base import NoOptions, Note, Pass, PassContext, PassResult


class InlineFunctions(Pass):
    """Inline every call of a model-local function; the functions go with them."""

    name = "inline-functions"
    summary = ("Inline model-local ONNX functions (TensorRT before 9.0 does not read them; "
               "passes then see their nodes).")
    Options = NoOptions

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        from onnx import inliner

        result = PassResult(changed=False)
        functions = {(f.domain or "", f.name) for f in graph.functions or ()}
        if not functions:
            result.notes.append(Note("graph", "the model has no local functions"))
            return result
        calls = Counter(f"{n.domain}.{n.op}" if n.domain else n.op
                        for g in all_graphs(graph) for n in g.nodes
                        if (n.domain or "", n.op) in functions)
        model, large = light_model(graph)
        convert = _opsets_differ(model)
        try:
            inlined = inliner.inline_local_functions(model, convert_version=convert)
        except Exception as err:  # noqa: BLE001 - the inliner or the converter refused
            text = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err)
            result.notes.append(Note("graph", f"onnx.inliner cannot inline the model's "
                                              f"functions: {text}"))
            return result
        new = to_graph(inlined)
        adopt(graph, new, large)
        graph.functions = new.functions
        for op, count in sorted(calls.items()):
            result.counts[f"inlined calls of {op}"] += count
        if not calls:
            result.counts["removed uncalled local functions"] += len(functions)
        result.changed = True
        return result


def _opsets_differ(model) -> bool:
    """Whether a function imports another version of a domain than the model does."""
    versions = {d.domain or "": d.version for d in model.opset_import}
    return any(versions.get(d.domain or "", d.version) != d.version
               for f in model.functions for d in f.opset_import)
