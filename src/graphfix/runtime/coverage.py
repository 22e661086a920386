"""If branches a BOOL graph input chooses, and the output check's runs of them.

The check runs the model on one set of inputs. Where an If's condition is a BOOL graph
input (optimum's merged decoders: `use_cache_branch` picks the decoder with or without
its cache), that run takes one branch only, and a rewrite that broke the other would
pass (the nineteenth round found one: T5's merged decoder). So the check runs the model
once more per such input, flipped (`OutputCheck.others`), and the run says so; where the
original cannot run with the input flipped, the run says which branch went unrun.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from graphfix.graph.protos import proto_label


def branch_inputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
                  ) -> dict[str, list[str]]:
    """BOOL graph inputs of one element fed in `feeds` that are the condition of
    main-graph If nodes -> those nodes' labels."""
    inputs = {vi.name for vi in model.graph.input}
    chosen: dict[str, list[str]] = {}
    for node in model.graph.node:
        cond = node.input[0] if node.op_type == "If" and node.input else ""
        if cond in inputs and cond in feeds:
            value = np.asarray(feeds[cond])
            if value.dtype == np.bool_ and value.size == 1:
                chosen.setdefault(cond, []).append(proto_label(node))
    return chosen


def branch_notes(branches: Mapping[str, list[str]], feeds: Mapping[str, np.ndarray],
                 flipped: Mapping[str, bool]) -> list[str]:
    """One note per input of `branches` (`branch_inputs`): both values checked
    (`flipped[name]`: the check with the input flipped runs), or the branch the check
    could not run, and how to run it."""
    notes = []
    for name, labels in branches.items():
        value = bool(np.asarray(feeds[name]).reshape(()))
        nodes = f"{labels[0]} takes" if len(labels) == 1 else f"{len(labels)} If nodes take"
        if flipped.get(name):
            notes.append(f"the check runs the model with {name} = {value} and again with "
                         f"{not value}: {nodes} a branch by it")
            continue
        taken, other = ("then", "else") if value else ("else", "then")
        notes.append(f"the check feeds {name} = {value}: {nodes} only the {taken} branch "
                     f"(the original does not run with {not value}), so rewrites in the "
                     f"{other} branch were checked structurally but not run; run again with "
                     f"--input-value {name}={int(not value)} to run it")
    return notes
