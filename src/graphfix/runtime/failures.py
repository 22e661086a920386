"""Why the original model cannot run on the check's inputs, and which input is to blame.

onnxruntime names the failing node ("... running Reshape node. Name:'r' Status Message:
..."). The graph inputs that node is computed from (followed back through producers,
into and out of subgraphs) are the suspects. One suspect is named; among several, each
is replaced in turn by a plain value (zeros for floats; the model's constant, else ones,
for integers) and the model re-run on one session: the input whose replacement lets it
run is named. At most `MAX_TRIES` re-runs, so this stays cheap.

An error that names no running node may come from loading the model (a type that
contradicts its node, an op onnxruntime lacks): then the model is loaded on its own,
and when that fails too, no input is to blame: the graph itself is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from graphfix.errors import said
from graphfix.graph.protos import all_nodes, subgraphs
from graphfix.runtime.values import constant_hints

MAX_TRIES = 8
_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)'")
_STATUS = re.compile(r"Status Message:\s*(.*)", re.S)
_SOURCE = re.compile(r"^\S+\.(h|cc|cpp):\d+ .*? (was false\.|failed\.)\s*", re.S)


def ort_message(err: BaseException) -> str:
    """onnxruntime's message without its source locations: "running Reshape node
    'frames': The input tensor cannot be reshaped ... requested shape:{0,-1}"."""
    text = str(err)
    node, status = _NODE.search(text), _STATUS.search(text)
    if not (node and status):
        return said(err)
    detail = _SOURCE.sub("", status.group(1).strip()).strip()
    detail = " ".join(detail.split())[:300] or said(err)
    return f"running {node.group(1)} node '{node.group(2)}': {detail}"


def _suspects(model: onnx.ModelProto, node_name: str, inputs: Sequence[str]) -> list[str]:
    """The graph inputs the node named `node_name` is computed from, in `inputs` order."""
    nodes = list(all_nodes(model.graph))
    producer = {out: n for n in nodes for out in n.output if out}
    owner: dict[int, onnx.NodeProto] = {}  # id(subgraph node) -> the If/Loop holding it
    for n in nodes:
        for sub in subgraphs(n):
            for inner in all_nodes(sub):
                owner.setdefault(id(inner), n)
    start = [n for n in nodes if n.name == node_name]
    seen_nodes: set[int] = set()
    found: set[str] = set()
    while start:
        node = start.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        for name in node.input:
            if name in inputs:
                found.add(name)
            elif name in producer:
                start.append(producer[name])
        if id(node) in owner:  # a branch runs only when its If's condition says so
            start.append(owner[id(node)])
    return [name for name in inputs if name in found]


def _plain(model: onnx.ModelProto, name: str, value: np.ndarray) -> np.ndarray:
    if value.dtype.kind in "iu":
        hint = constant_hints(model, [name]).get(name, 1)
        return np.full(value.shape, hint, value.dtype)
    return np.zeros_like(value)


def culprit(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], err: BaseException,
            providers: Sequence[str] = ("cpu",)) -> tuple[str, str]:
    """(the failing node as 'Reshape node 'r'', the input to blame) from onnxruntime's
    error; either is '' when it cannot be told."""
    match = _NODE.search(str(err))
    node = f"{match.group(1)} node '{match.group(2)}'" if match else ""
    names = list(feeds)
    suspects = _suspects(model, match.group(2), names) if match else names
    if len(suspects) == 1:
        return node, suspects[0]
    if not suspects or len(suspects) > MAX_TRIES:
        return node, ""
    from graphfix.runtime.session import make_session

    try:
        sess = make_session(model, providers)
    except Exception:  # it cannot even load: no input is to blame
        return node, ""
    for name in suspects:
        tried = dict(feeds)
        tried[name] = _plain(model, name, np.asarray(feeds[name]))
        try:
            sess.run(None, tried)
        except Exception:  # still failing: not this one (alone)
            continue
        return node, name
    return node, ""


NOT_LOADED = ("the model itself is at fault: onnxruntime rejects its graph before reading "
              "any input, so no input is to blame")
LOAD_FIX = ("make a model onnxruntime loads (onnx.checker.check_model(model, full_check=True) "
            "finds declared types that contradict their nodes, such as a stale value_info a "
            "float16 converter left), e.g. by exporting or converting it again")
NO_KERNEL_FIX = ("onnxruntime has no kernel for the node it names (on these providers): "
                 "compare where one exists (another onnxruntime build or provider), or "
                 "use ops it implements")
_NO_KERNEL = re.compile(r"NOT_IMPLEMENTED|Could not find an implementation")


def fails_to_load(model: onnx.ModelProto, err: BaseException,
                  providers: Sequence[str] = ("cpu",)) -> bool:
    """Whether `err` is onnxruntime refusing `model` itself, not its inputs: the error
    names no node it was running, and the model does not load on its own either."""
    if _NODE.search(str(err)):
        return False
    from graphfix.runtime.session import make_session

    try:
        make_session(model, providers)
    except Exception:  # onnxruntime raises many types; any means it does not load
        return True
    return False


def explain(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], err: BaseException,
            providers: Sequence[str] = ("cpu",)) -> tuple[str, str]:
    """(why: onnxruntime's message and the node and input to blame where they can be
    told; fix: how to give inputs the model accepts). When the model itself does not
    load (`fails_to_load`), why says so and fix is how to repair the model."""
    why, fix, _ = _explained(model, feeds, err, providers)
    return why, fix


def _explained(model, feeds, err, providers) -> tuple[str, str, bool]:
    """`explain`'s (why, fix), and whether the model failed to load."""
    if fails_to_load(model, err, providers):
        fix = NO_KERNEL_FIX if _NO_KERNEL.search(str(err)) else LOAD_FIX
        return f"{ort_message(err)}; {NOT_LOADED}", fix, True
    node, name = culprit(model, feeds, err, providers)
    why = ort_message(err)
    if name:
        value = np.asarray(feeds[name])
        shown = str(value.reshape(-1)[:4].tolist())[:-1] + (", ...]" if value.size > 4 else "]")
        why += (f"; that node is computed from input '{name}', which was {shown}" if node
                else f"; input '{name}' is to blame: it was {shown}")
    fix = f"--input-value {name}=VALUE" if name else "--input-value NAME=VALUE"
    return (why, f"give inputs the model accepts: real ones with --data, or fix an input "
            f"with {fix}", False)


def cannot_run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], err: BaseException,
               source: str, providers: Sequence[str] = ("cpu",)) -> str:
    """One line for a skipped check: what failed on `source` ('seeded random inputs',
    "the data in 'x.npz'"), why (`explain`), and the fix; or that the model does not
    load at all."""
    why, fix, not_loaded = _explained(model, feeds, err, providers)
    what = "run the input model (it does not load)" if not_loaded else \
        f"run the input model on {source}"
    return f"onnxruntime cannot {what}: {why}; {fix}"
