"""fuse-pad-conv: fold a zero constant Pad into the Conv or AveragePool that reads it.

A Pad over all r axes has pads [b_0, ..., b_{r-1}, e_0, ..., e_{r-1}]; a Conv or
pool over the spatial axes 2..r-1 has pads [p_2, ..., p_{r-1}, q_2, ..., q_{r-1}]
(begins, then ends). Zero padding on spatial axes only adds to the consumer's own::

    Conv(Pad(x, [0, 0, b.., 0, 0, e..], 0), W, B; pads=[p.., q..])
        -> Conv(x, W, B; pads=[p + b.., q + e..])
    AveragePool(Pad(x, [0, 0, b.., 0, 0, e..], 0); pads=[p.., q..], count_include_pad=c)
        -> AveragePool(x; pads=[p + b.., q + e..], count_include_pad=1)

AveragePool: the Pad's zeros are real input cells, so the folded pool must count
its pad cells (count_include_pad=1). That equals the original when the pool
counted its own pads already (c=1) or had none (all p, q zero: c did not matter
before); a pool with own pads and c=0 cannot mix both and is skipped.

auto_pad=VALID means no implicit padding, the same as NOTSET with zero pads, so
it folds too: the consumer gets the Pad's pads explicitly and auto_pad=NOTSET.

Skipped, with a note: MaxPool (its pads act as -inf, so zeros are not the same
wherever inputs are negative); Pad in reflect/edge/wrap mode or with a non-zero
or non-constant value; non-constant pads or axes; negative pads (a crop); pads
on the batch or channel axis; a Pad output that is a graph output or has another
reader; a consumer with auto_pad SAME_UPPER or SAME_LOWER (whose implicit pads
depend on the input size), or with auto_pad=VALID together with a pads
attribute (ONNX forbids the pair); a consumer reading the Pad at another input, or
(pools) with ceil_mode=1, whose last window is placed differently once the
padding is implicit (onnxruntime then drops a last window that starts in the
pool's own padding); a pool whose summed pads would not all be smaller than its
kernel (onnxruntime refuses such a pool). Pad opsets 2 (attributes), 11/13 (pads
and value as inputs) and 18+ (optional constant `axes` input) are handled.

The consumer keeps its output tensor; the disconnected Pad is left for `cleanup`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import (
    all_graphs,
    constant_value,
    is_graph_output,
    is_onnx,
    node_label,
    opset_of,
    replace_in,
)
from graphfix.passes.base import LIMIT_REACHED, NoOptions, Note, Pass, PassContext, PassResult

_CONSUMERS = ("Conv", "AveragePool", "MaxPool")
MAXPOOL = (
    "it feeds a MaxPool, whose own pads act as -inf: folding zero padding would "
    "change the maximum wherever the inputs are negative"
)


@dataclass(frozen=True)
class _Fold:
    """Write `pads` (and `attrs`) into `consumer`, which then reads the Pad's input."""

    consumer: gs.Node
    pads: list[int]
    attrs: dict = field(default_factory=dict)


class FusePadConv(Pass):
    """Fold a zero constant-mode Pad into the pads of the Conv or AveragePool after it.

    Handles Conv of any spatial rank with existing pads, strides, dilations and
    groups, and AveragePool (setting count_include_pad=1 where that keeps the
    average), in the main graph and in If/Loop/Scan bodies. The Pad may be the
    opset-2 form (mode/pads/value attributes), the opset-11 form (pads and
    optional constant_value inputs) or the opset-18 form with an optional
    constant `axes` input (negative axes resolved against the consumer's rank).
    A consumer with auto_pad=VALID (no implicit padding) folds like one with zero
    pads and is left with explicit pads and auto_pad=NOTSET.

    Every Pad that is not folded gets a note saying why (see the module docstring).
    """

    name = "fuse-pad-conv"
    summary = "Fold a zero constant Pad into the pads of the Conv or AveragePool that reads it"
    Options = NoOptions
    counts_rewrites = True  # each Pad folded is one rewrite

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        opset = opset_of(graph)
        found = 0
        for g in list(all_graphs(graph)):
            for pad in [n for n in g.nodes if is_onnx(n, "Pad")]:
                if not pad.outputs:
                    continue
                found += 1
                checked = _check(g, pad, opset)
                if isinstance(checked, str):
                    result.notes.append(Note(node_label(pad), checked))
                    continue
                label = f"{node_label(pad)} into {node_label(checked.consumer)}"
                if not ctx.allow_rewrite(self.name, label):
                    result.notes.append(Note(node_label(pad), LIMIT_REACHED))
                    continue
                _rewrite(pad, checked)
                result.counts[f"folded Pad into {checked.consumer.op}"] += 1
                result.changed = True
        if not found:
            result.notes.append(Note("graph", "no Pad in the graph"))
        return result


# ----------------------------------------------------------------------------- check


def _check(g: gs.Graph, pad: gs.Node, opset: int) -> _Fold | str:
    """How to fold `pad` into its consumer, or why it cannot be folded."""
    reason = _check_mode_and_value(pad, opset)
    if reason:
        return reason
    consumer = _consumer(g, pad)
    if isinstance(consumer, str):
        return consumer
    spatial = _spatial_pads(pad, consumer, opset)
    if isinstance(spatial, str):
        return spatial
    return _plan(consumer, spatial)


def _check_mode_and_value(pad: gs.Node, opset: int) -> str | None:
    mode = pad.attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode != "constant":
        return f"it pads in {mode} mode; only zero constant padding matches a Conv's or pool's pads"
    if opset < 11:
        value = np.asarray(float(pad.attrs.get("value", 0.0)))
    elif len(pad.inputs) > 2 and not pad.inputs[2].is_empty():
        value = constant_value(pad.inputs[2])
        if value is None:
            return "its pad value is not a constant"
    else:
        return None
    if np.any(value != 0):
        return f"it pads with the value {np.reshape(value, -1)[0]:g}, not 0"
    return None


def _consumer(g: gs.Graph, pad: gs.Node) -> gs.Node | str:
    y = pad.outputs[0]
    if is_graph_output(g, y):
        return "the Pad output is a graph output, so the padded tensor must stay"
    if not y.outputs:
        return "its output is not read by any node"
    if len(y.outputs) > 1:
        return "the Pad output is also read by another node, which needs the padded tensor"
    node = y.outputs[0]
    if not is_onnx(node, *_CONSUMERS):
        return f"it feeds {node_label(node)}, not a Conv, AveragePool or MaxPool"
    if node.inputs[0] is not y:
        return f"it feeds {node_label(node)} at another input than the data input"
    if node.op == "MaxPool":
        return MAXPOOL
    auto_pad = _auto_pad(node)
    if auto_pad not in ("NOTSET", "VALID"):
        return f"the {node.op} has auto_pad={auto_pad}, which computes its own pads"
    if int(node.attrs.get("ceil_mode", 0)):
        return (
            f"the {node.op} has ceil_mode=1, whose last window is placed differently "
            "once the padding is its own"
        )
    return node


def _auto_pad(node: gs.Node) -> str:
    """The node's auto_pad, with the empty string (an unset attribute) read as NOTSET."""
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    return auto_pad or "NOTSET"


def _spatial_pads(pad: gs.Node, consumer: gs.Node, opset: int) -> np.ndarray | str:
    """The Pad's pads on the spatial axes as [begins.., ends..], or why they do not fold."""
    if opset < 11:
        pads = np.asarray(pad.attrs.get("pads", []), dtype=np.int64)
    else:
        pads = constant_value(pad.inputs[1]) if len(pad.inputs) > 1 else None
        if pads is None:
            return "its pads input is not a constant"
        pads = np.asarray(pads, dtype=np.int64).reshape(-1)
    axes = _optional(pad, 3) if opset >= 18 else None
    if axes is not None:
        full = _expand_axes(pad, axes, pads, consumer)
        if isinstance(full, str):
            return full
        pads = full
    rank = pads.size // 2
    if pads.size % 2 or rank < 3:
        return f"its {pads.size} pads do not cover a batch, a channel and a spatial axis"
    if np.any(pads < 0):
        return "it has negative pads, which crop instead of pad"
    begins, ends = pads[:rank], pads[rank:]
    if np.any(begins[:2]) or np.any(ends[:2]):
        return "it pads the batch or channel axis, which a Conv or pool cannot pad"
    known = _rank(consumer, None)
    if known is not None and known != rank:
        return f"it pads {rank} axes but the {consumer.op} input has rank {known}"
    return np.concatenate([begins[2:], ends[2:]])


def _expand_axes(
    pad: gs.Node, axes_tensor: gs.Tensor, pads: np.ndarray, consumer: gs.Node
) -> np.ndarray | str:
    """Opset 18+: pads given for `axes` only, spread over all axes of the input."""
    axes = constant_value(axes_tensor)
    if axes is None:
        return "its axes input is not a constant"
    axes = np.asarray(axes, dtype=np.int64).reshape(-1)
    rank = _rank(consumer, pad.inputs[0])
    if rank is None:
        return "the rank of its input is unknown, so its axes cannot be placed"
    if pads.size != 2 * axes.size or np.any(axes < -rank) or np.any(axes >= rank):
        return f"its axes {axes.tolist()} and pads {pads.tolist()} do not fit rank {rank}"
    axes = axes % rank
    if len(set(axes.tolist())) != axes.size:
        return f"its axes {axes.tolist()} repeat an axis"
    full = np.zeros(2 * rank, dtype=np.int64)
    full[axes] = pads[: axes.size]
    full[axes + rank] = pads[axes.size :]
    return full


def _rank(consumer: gs.Node, data: gs.Tensor | None) -> int | None:
    """The rank of the consumer's data input, from its attributes or known shapes."""
    kernel = consumer.attrs.get("kernel_shape")
    if kernel:
        return len(kernel) + 2
    if consumer.op == "Conv" and len(consumer.inputs) > 1 and consumer.inputs[1].shape:
        return len(consumer.inputs[1].shape)
    if data is not None and data.shape is not None:
        return len(data.shape)
    return None


def _optional(node: gs.Node, index: int) -> gs.Tensor | None:
    if len(node.inputs) <= index or node.inputs[index].is_empty():
        return None
    return node.inputs[index]


def _plan(consumer: gs.Node, spatial: np.ndarray) -> _Fold | str:
    own = consumer.attrs.get("pads")
    attrs = {}
    if _auto_pad(consumer) == "VALID":
        # VALID is "no padding": the same as NOTSET with zero pads, so the Pad's pads
        # become the consumer's explicit pads. ONNX forbids pads beside auto_pad
        # (onnxruntime refuses such a Conv), so that node is left as it is.
        if own is not None:
            return (
                f"the {consumer.op} has auto_pad=VALID and also pads {list(own)}, "
                "which ONNX does not allow together"
            )
        attrs["auto_pad"] = "NOTSET"
    own = np.zeros(spatial.size, dtype=np.int64) if own is None else np.asarray(own, np.int64)
    if own.size != spatial.size:
        return f"the {consumer.op} has {own.size} pads where {spatial.size} are needed"
    if consumer.op == "AveragePool" and not int(consumer.attrs.get("count_include_pad", 0)):
        if np.any(own):
            return (
                "the AveragePool leaves its own pads out of the average "
                "(count_include_pad=0), but the Pad's zeros are counted"
            )
        attrs["count_include_pad"] = 1
    pads = [int(v) for v in own + spatial]
    kernel = list(consumer.attrs.get("kernel_shape", []))
    too_wide = any(p >= k for p, k in zip(pads, kernel * 2, strict=False))
    if consumer.op != "Conv" and too_wide:
        return (
            f"the {consumer.op} pads would become {pads}, not all smaller than its kernel "
            f"{kernel}, which onnxruntime refuses"
        )
    return _Fold(consumer, pads, attrs)


# ----------------------------------------------------------------------------- rewrite


def _rewrite(pad: gs.Node, fold: _Fold) -> None:
    """The consumer reads the Pad's input with the summed pads; the Pad is disconnected."""
    consumer = fold.consumer
    consumer.attrs["pads"] = fold.pads
    consumer.attrs.update(fold.attrs)
    replace_in(consumer.inputs, pad.outputs[0], pad.inputs[0])
    pad.inputs.clear()
    pad.outputs.clear()
