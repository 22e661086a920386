"""What the output check cannot run: If branches a BOOL graph input chooses.

The check runs the model once, on one set of inputs. Where an If's condition is a
BOOL graph input (optimum's merged decoders: `use_cache_branch` picks the decoder with
or without its cache), that run takes one branch, and a rewrite in the other is held
to the structural checks only (onnx.checker, shape inference). The run says so, and
how to run the other branch too.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from graphfix.graph.protos import proto_label


def unrun_branches(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[str]:
    """One note per BOOL graph input that is the condition of main-graph If nodes: the
    value the check feeds, the branch those Ifs take, the one they leave unrun."""
    inputs = {vi.name for vi in model.graph.input}
    chosen: dict[str, list[str]] = {}
    for node in model.graph.node:
        cond = node.input[0] if node.op_type == "If" and node.input else ""
        if cond in inputs and cond in feeds:
            value = np.asarray(feeds[cond])
            if value.dtype == np.bool_ and value.size == 1:
                chosen.setdefault(cond, []).append(proto_label(node))
    notes = []
    for name, labels in chosen.items():
        value = bool(np.asarray(feeds[name]).reshape(()))
        taken, other = ("then", "else") if value else ("else", "then")
        nodes = f"{labels[0]} runs" if len(labels) == 1 else f"{len(labels)} If nodes run"
        notes.append(f"the check feeds {name} = {value}: {nodes} only the {taken} "
                     f"branch, so rewrites in the {other} branch were checked structurally "
                     f"but not run; run again with --input-value {name}={int(not value)} to "
                     "run it")
    return notes
