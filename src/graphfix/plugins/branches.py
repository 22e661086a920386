"""If branches whose outputs share names, which TensorRT's parser refuses.

Every TensorRT operator table's If row says: "Output tensors of the two conditional
branches must have [...] different names" (trt/onnx_trt_operators.json, 8.0 to 11.1).
ONNX allows it (each branch is its own scope), and optimum's merged decoders do it: both
branches of `decoder_model_merged.onnx` are the whole decoder, writing `logits` and
every `present.*` under the same names. Names inside a branch are its own, so giving
the else branch's outputs fresh names changes nothing the model computes: the If's own
outputs keep theirs. An else-branch output made by a node there is renamed where it is
made; one that is a constant of the branch (an initializer) is returned as a constant
of the fresh name holding the same values. (A branch cannot return a tensor of an
enclosing graph: onnx.checker refuses "Graph output 'x' is not an output of any node".)
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphfix.graph import fresh_name

RESTRICTION = "different names"
"""What the If row's restriction text says, in every table that has the rule."""


def applies(target) -> bool:
    """Whether `target`'s If row states the rule."""
    row = target.op("If") if target is not None else None
    return row is not None and RESTRICTION in (row.restrictions or "")


def clashing(node: gs.Node) -> list[int]:
    """The indices of the else branch's outputs named like the then branch's."""
    then, other = node.attrs.get("then_branch"), node.attrs.get("else_branch")
    if not isinstance(then, gs.Graph) or not isinstance(other, gs.Graph):
        return []
    taken = {t.name for t in then.outputs}
    return [i for i, t in enumerate(other.outputs) if t.name in taken]


def rename_else_outputs(node: gs.Node, names: set[str]) -> int:
    """Give the else branch's clashing outputs (`clashing`) fresh names; how many."""
    other = node.attrs["else_branch"]
    made = {id(n) for n in other.nodes}
    renamed = 0
    for i in clashing(node):
        t = other.outputs[i]
        if t.inputs and id(t.inputs[0]) in made:
            t.name = fresh_name(f"{t.name}_else", names)
        elif isinstance(t, gs.Constant):  # the same values (not read: deferred stay so)
            other.outputs[i] = gs.Constant(fresh_name(f"{t.name}_else", names), t._values,
                                           data_location=t.data_location)
        else:
            continue
        renamed += 1
    return renamed
