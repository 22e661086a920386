"""The NCHWc part of unfuse-contrib: onnxruntime's blocked-layout region back to standard ONNX.

With ORT_ENABLE_ALL on a CPU with NCHWc kernels, onnxruntime's NchwcTransformer turns
Conv, pools and nearest/linear Resize into `com.microsoft.nchwc` ops on tensors in
NCHWc layout: channels cut into blocks of B (8 with AVX2, 16 with AVX-512 and ARM64)
and the block moved innermost, [N, Cpad/B, H, W, B] in memory for a tensor whose
logical shape stays [N, Cpad, H, W], Cpad being C rounded up to B. ReorderInput and
ReorderOutput convert at the region's edges. Inside, standard Add/Sum/Mul,
Relu/Sigmoid/Tanh and Concat(axis=1) read blocked tensors directly (elementwise
ops on equal shapes and a concat of whole blocks do not depend on the layout), and
a Reshape pair [0,-1,0,0,B] ... [0,-1,0,0] gives a broadcasting Add a 5-D view.

Every blocked tensor is read back as the plain NCHW tensor with Cpad channels (the
padding channels never reach an output: ReorderOutput crops them). ReorderInput pads a
tensor of c channels with zeros up to Cpad, so where c is not a multiple of B (120
channels with B=16) the plain rewrite must pad too, or cut the padded input channels
from the weights of the Convs that read it (zeros times zero-padded weights add
nothing)::

    ReorderInput(x)              -> x               (channels_last=1: Transpose(x, [0,3,1,2]))
                                    then Pad(zeros, channels c -> Cpad) when c % B != 0;
                                    no Pad when every reader is a group-1 Conv: its
                                    weights' zero-padded input channels are cut instead
    ReorderOutput(t, channels=c) -> Slice(t, [0], [c], axes=[1]) if Cpad != c, else t
                                    (channels_last=1: then Transpose [0,2,3,1])
    nchwc.Conv(x, Wb, b, sum)    -> act(Conv(x, unblock(Wb), b) + sum)
    nchwc.MaxPool/AveragePool/GlobalMaxPool/GlobalAveragePool(t) -> the standard op
    nchwc.Upsample(t, scales)    -> Resize(t, '', scales), same mode and coordinate mode
                                    (nearest: nearest_mode=floor, as the NCHWc kernel)
    Reshape(t, [0,-1,0,0,B]), Reshape(u, [0,-1,0,0]) -> removed

MLAS stored the weights reordered, output channels zero-padded to Cpad: OIHWBiBo for
a conv that reads a blocked input, OIHWBo for a depthwise conv and for a conv that
reads an NCHW input with fewer than B channels::

    OIHWBiBo: Wb[o//B, i//B, h, w, i%B, o%B] = W[o, i, h, w]
    OIHWBo:   Wb[o//B, i,    h, w,      o%B] = W[o, i, h, w]

Undoing that is an exact permutation once B is known. B is not recorded in the
model: it is inferred from the graph (padded channel counts, Reshape block
constants, which convs read a blocked input) or given as the `nchwc-block` option.
When 8 and 16 both fit and the weights would read differently, the region is left
alone with a note. The rewrite is all-or-nothing per graph.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import bypass, constant_value, is_graph_output, is_onnx, node_label
from graphfix.passes._unfuse_emit import (
    Activation,
    Emitter,
    Step,
    conv_activation,
    replace_with_chain,
)

NCHWC = "com.microsoft.nchwc"
BLOCKS = (8, 16)
_POOLS = ("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool")
_KNOWN = ("ReorderInput", "ReorderOutput", "Conv", "Upsample", *_POOLS)
_ELEMENTWISE = ("Relu", "Sigmoid", "Tanh", "Add", "Sum", "Mul")
BLOCKED, SPLIT = "blocked", "split"
# A condition on the block size, and where it comes from (a text, or the text for a given B).
Rule = tuple[str | Callable[[int], str], Callable[[int], bool]]
Channels = Callable[[int], int]  # Cpad of a blocked tensor, given the block size
_SAME_CHANNELS = (*_ELEMENTWISE, "Div", "Sub", "Clip", "HardSigmoid", "HardSwish", "LeakyRelu",
                  "Identity", "GlobalAveragePool", "GlobalMaxPool", "MaxPool", "AveragePool")
AMBIGUOUS = (
    "the NCHWc block size cannot be told from this graph: 8 (AVX2) and 16 (AVX-512, "
    "ARM64) both fit, and its weights read differently under each; run with "
    "unfuse-contrib{nchwc-block=8} or {nchwc-block=16} for the machine that saved it, "
    "or re-export the model or save the optimized model with ORT_ENABLE_EXTENDED, not ALL"
)


def is_nchwc(node: gs.Node) -> bool:
    """An NCHWc op (ReorderInput/ReorderOutput also under com.microsoft, as older releases)."""
    return node.domain == NCHWC or (
        node.domain == "com.microsoft" and node.op in ("ReorderInput", "ReorderOutput")
    )


class _Skip(Exception):
    def __init__(self, node: gs.Node | None, reason: str) -> None:
        super().__init__(reason)
        self.subject = node_label(node) if node is not None else "graph"
        self.reason = reason


@dataclass
class Region:
    """The NCHWc nodes of one graph and what the rewrite needs to know about them."""

    nodes: list[gs.Node]
    layout: dict[int, str] = field(default_factory=dict)  # id(tensor) -> BLOCKED | SPLIT
    reshapes: list[gs.Node] = field(default_factory=list)
    split_tensors: list[gs.Tensor] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    kinds: dict[int, str] = field(default_factory=dict)  # id(conv) -> "BiBo" | "Bo"
    acts: dict[int, Activation | None] = field(default_factory=dict)
    cpads: dict[int, Channels | None] = field(default_factory=dict)  # id(ReorderOutput) -> Cpad
    plain: dict[int, int] = field(default_factory=dict)  # id(ReorderInput) -> channels it reads
    trim: dict[int, int] = field(default_factory=dict)  # id(Conv) -> input channels to keep
    layout_free: bool = True  # the weights read the same under every block size
    block: int = 0


def analyse(g: gs.Graph, opset: int, option: int) -> Region | tuple[str, str] | None:
    """The region to rewrite (block size chosen), (subject, reason) why not, or None if none."""
    nodes = [n for n in g.nodes if is_nchwc(n) and n.outputs]
    if not nodes:
        return None
    region = Region(nodes)
    try:
        _propagate(g, region)
        for node in nodes:
            _check(node, region, opset)
        region.block = _choose_block(region, option)
    except _Skip as skip:
        return skip.subject, f"{len(nodes)} NCHWc nodes left in place: {skip.reason}"
    return region


# ----------------------------------------------------------------------------- layout


def _propagate(g: gs.Graph, region: Region) -> None:
    """Mark every tensor in NCHWc layout; fail on a reader whose result depends on it."""
    node_ids = {id(n) for n in g.nodes}
    work: list[gs.Tensor] = []
    readers: list[gs.Node] = []

    def mark(tensor: gs.Tensor, kind: str, by: gs.Node) -> None:
        seen = region.layout.get(id(tensor))
        if seen is None:
            region.layout[id(tensor)] = kind
            work.append(tensor)
            if kind == SPLIT:
                region.split_tensors.append(tensor)
        elif seen != kind:
            raise _Skip(by, "it mixes a blocked tensor with the 5-D view of one")

    for node in region.nodes:
        if node.op not in _KNOWN:
            raise _Skip(node, f"onnxruntime's NCHWc op {node.op} has no standard rewrite here")
        if len(node.outputs) != 1:
            raise _Skip(node, f"it has {len(node.outputs)} outputs instead of 1")
        if node.op != "ReorderOutput":
            mark(node.outputs[0], BLOCKED, node)
    while work:
        tensor = work.pop()
        kind = region.layout[id(tensor)]
        if is_graph_output(g, tensor):
            raise _Skip(tensor.inputs[0], "its output in NCHWc layout is a graph output")
        for reader in tensor.outputs:
            if id(reader) not in node_ids:
                raise _Skip(reader, "it reads a tensor in NCHWc layout from inside a subgraph")
            if is_nchwc(reader):
                continue
            mark(reader.outputs[0], _reader_kind(reader, kind, region), reader)
            readers.append(reader)
    for reader in readers:  # now that every tensor is marked: all operands alike
        kinds = {region.layout.get(id(t)) for t in reader.inputs}
        if len(kinds) > 1 and not is_onnx(reader, "Reshape"):
            raise _Skip(reader, "it combines a tensor in NCHWc layout with one that is not")


def _reader_kind(reader: gs.Node, kind: str, region: Region) -> str:
    """The layout of a standard node's output that reads a tensor in layout `kind`."""
    if is_onnx(reader, *_ELEMENTWISE):
        return kind
    if is_onnx(reader, "Concat") and kind == BLOCKED:
        if int(reader.attrs.get("axis", 0)) != 1:
            raise _Skip(reader, "it concatenates tensors in NCHWc layout on an axis other than 1")
        return BLOCKED
    if is_onnx(reader, "Reshape") and len(reader.inputs) == 2:
        shape = constant_value(reader.inputs[1])
        values = shape.tolist() if shape is not None and shape.ndim == 1 else []
        plain = int(reader.attrs.get("allowzero", 0)) == 0 and values[:1] == [0]
        if plain and kind == BLOCKED and len(values) == 5 and values[2:4] == [0, 0]:
            block = int(values[4])
            region.rules.append((f"{node_label(reader)} views blocks of {block}",
                                 lambda b, block=block: b == block))
            region.reshapes.append(reader)
            return SPLIT
        if plain and kind == SPLIT and len(values) == 4 and values[2:4] == [0, 0]:
            region.reshapes.append(reader)
            return BLOCKED
    raise _Skip(reader, "it reads a tensor in NCHWc layout, and its result depends on that layout")


def _channels(tensor: gs.Tensor, memo: dict[int, Channels | None]) -> Channels | None:
    """Cpad of a tensor in NCHWc layout as a function of B, when the graph tells it."""
    if id(tensor) in memo:
        return memo[id(tensor)]
    memo[id(tensor)] = None
    found: Channels | None = None
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if producer is not None and is_nchwc(producer) and producer.op == "Conv":
        dims = _dims(producer.inputs[1])
        found = (lambda b, out=dims[0]: out) if dims else None
    elif producer is not None and is_nchwc(producer) and producer.op == "ReorderInput":
        c = plain_channels(producer.inputs[0], int(producer.attrs.get("channels_last", 0)))
        found = (lambda b, c=c: -(-c // b) * b) if c is not None else None
    elif producer is not None and is_onnx(producer, "Concat"):
        parts = [_channels(t, memo) for t in producer.inputs]
        if parts and None not in parts:
            found = lambda b, parts=parts: sum(p(b) for p in parts)  # noqa: E731
    elif producer is not None:
        found = next((c for t in producer.inputs if (c := _channels(t, memo)) is not None), None)
    memo[id(tensor)] = found
    return found


def plain_channels(tensor: gs.Tensor, channels_last: int = 0, depth: int = 0) -> int | None:
    """The channel count of a plain (NCHW, or NHWC with `channels_last`) tensor: from its
    shape, else from the ReorderOutput, Conv or channel-keeping ops that made it."""
    dims = tensor.shape
    if dims is not None and len(dims) == 4:
        c = dims[3 if channels_last else 1]
        if isinstance(c, (int, np.integer)) and c > 0:
            return int(c)
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 and depth < 64 else None
    if producer is None:
        return None
    if is_nchwc(producer) and producer.op == "ReorderOutput":
        same = int(producer.attrs.get("channels_last", 0)) == channels_last
        return int(producer.attrs.get("channels", 0)) or None if same else None
    if is_onnx(producer, "Conv") and not channels_last and len(producer.inputs) > 1:
        weights = _dims(producer.inputs[1])
        return weights[0] if weights else None
    if is_onnx(producer, *_SAME_CHANNELS):
        found = (plain_channels(t, channels_last, depth + 1) for t in producer.inputs
                 if t.shape is None or len(t.shape) == 4)
        return next((c for c in found if c is not None), None)
    return None


def _dims(tensor: gs.Tensor) -> list[int] | None:
    """The tensor's shape when every dimension is a known integer."""
    shape = tensor.shape
    if shape is None or any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        return None
    return [int(d) for d in shape]


# ----------------------------------------------------------------------------- checks


def _check(node: gs.Node, region: Region, opset: int) -> None:
    """Check one NCHWc node; record its rules on B and what its rewrite needs."""
    label, memo = node_label(node), {}
    x = node.inputs[0] if node.inputs else None
    x_kind = region.layout.get(id(x)) if x is not None else None
    if node.op == "ReorderInput":
        if x_kind is not None:
            raise _Skip(node, "its input is already in NCHWc layout")
        c = plain_channels(x, int(node.attrs.get("channels_last", 0)))
        if c is None:
            raise _Skip(node, "the number of channels it reads cannot be told from the graph "
                        "(it pads them to a multiple of the block size); run shape inference "
                        "on the model first")
        region.plain[id(node)] = c
        return
    if node.op == "Conv":
        _check_conv(node, region, x_kind, opset)
        return
    if x_kind != BLOCKED:
        raise _Skip(node, "its input is not in NCHWc layout")
    cpad = _channels(x, memo)
    if node.op == "ReorderOutput":
        channels = int(node.attrs.get("channels", 0))
        if channels <= 0:
            raise _Skip(node, "it has no positive channels attribute")
        region.cpads[id(node)] = cpad
        if cpad is not None:
            region.rules.append((lambda b, p=cpad: f"{label} crops {p(b)} channels to {channels}",
                                 lambda b, p=cpad, c=channels: p(b) == -(-c // b) * b))
    elif node.op == "Upsample":
        scales = list(node.attrs.get("scales", []) or [])
        if opset < 11:
            raise _Skip(node, f"opset {opset} has no Resize with nearest_mode, which it needs")
        if len(scales) != 4 or any(int(s) <= 0 for s in scales):
            raise _Skip(node, "its scales attribute is not 4 positive integers")
    elif cpad is not None:
        region.rules.append((lambda b, p=cpad: f"{label} pools {p(b)} channels",
                             lambda b, p=cpad: p(b) % b == 0))


def _check_conv(node: gs.Node, region: Region, x_kind: str | None, opset: int) -> None:
    label = node_label(node)
    if x_kind == SPLIT or len(node.inputs) < 2:
        raise _Skip(node, "its input is not a 4-D tensor")
    weights = node.inputs[1]
    if not isinstance(weights, gs.Constant) or len(weights.shape) != 4:
        raise _Skip(node, "its reordered weights are not a 4-D initializer")
    if len(node.inputs) > 3 and not node.inputs[3].is_empty():
        if region.layout.get(id(node.inputs[3])) != BLOCKED:
            raise _Skip(node, "its Sum input is not in NCHWc layout")
    act = conv_activation(node, opset)
    if isinstance(act, str):
        raise _Skip(node, act)
    region.acts[id(node)] = act
    out, inp, kh, kw = (int(d) for d in weights.shape)
    group = int(node.attrs.get("group", 1))
    rules = [(f"{label} has {out} output channels", lambda b: out % b == 0)]
    if x_kind == BLOCKED and group > 1 and inp == 1:
        kind = "Bo"  # depthwise
    elif x_kind == BLOCKED:
        kind = "BiBo"
        rules.append((f"{label} reads {inp} channels per group in blocks", lambda b: inp % b == 0))
        cpad = _channels(node.inputs[0], {})
        if cpad is not None:
            rules.append((lambda b: f"{label} reads {inp * group} of {cpad(b)} channels",
                          lambda b: inp * group == cpad(b)))
        if group > 1:
            rules.append((f"{label} has {out // group} output channels per group",
                          lambda b: (out // group) % b == 0))
    elif group == 1:
        kind = "Bo"
        rules.append((f"{label} reads {inp} channels unblocked", lambda b: inp < b))
    else:
        raise _Skip(node, f"it has group={group} but reads a tensor not in NCHWc layout")
    region.rules.extend(rules)
    region.kinds[id(node)] = kind
    region.layout_free &= kind == "Bo" and inp * kh * kw == 1


def _choose_block(region: Region, option: int) -> int:
    candidates = (option,) if option else BLOCKS
    fails = {b: [why(b) if callable(why) else why for why, holds in region.rules if not holds(b)]
             for b in candidates}
    fits = [b for b in candidates if not fails[b]]
    first = region.nodes[0]
    if option and not fits:
        raise _Skip(first, f"the graph does not fit nchwc-block={option}: {fails[option][0]}")
    if not fits:
        raise _Skip(first, f"neither NCHWc block size fits (8: {fails[8][0]}; 16: {fails[16][0]})")
    if len(fits) > 1 and not region.layout_free:
        raise _Skip(first, AMBIGUOUS)
    return fits[0]


# ----------------------------------------------------------------------------- rewrite


def unblock(weights: np.ndarray, kind: str, block: int) -> np.ndarray:
    """OIHWBiBo or OIHWBo weights (stored with shape [Cpad, I, kh, kw]) back to OIHW."""
    out, inp, kh, kw = weights.shape
    if kind == "BiBo":
        blocks = weights.reshape(out // block, inp // block, kh, kw, block, block)
        ordered = blocks.transpose(0, 5, 1, 4, 2, 3)
    else:
        ordered = weights.reshape(out // block, inp, kh, kw, block).transpose(0, 4, 1, 2, 3)
    return np.ascontiguousarray(ordered.reshape(out, inp, kh, kw))


def rewrite(g: gs.Graph, region: Region, em: Emitter) -> Counter[str]:
    """Rewrite a checked region into standard ops; returns the counts."""
    counts: Counter[str] = Counter()
    unblocked: dict[tuple[int, str], gs.Constant] = {}
    for node in region.nodes:
        if node.op == "Conv":
            _rewrite_conv(node, region, em, unblocked)
            counts["rewrote NCHWc Conv as Conv"] += 1
        elif node.op in _POOLS:
            replace_with_chain(em, node, (node.op, [node.inputs[0]], dict(node.attrs)), [])
            counts[f"rewrote NCHWc {node.op} as {node.op}"] += 1
        elif node.op == "Upsample":
            replace_with_chain(em, node, _resize(node, em), [])
            counts["rewrote NCHWc Upsample as Resize"] += 1
        elif node.op == "ReorderInput":
            counts[_reorder_input(g, node, region, em)] += 1
        else:
            counts[_reorder_output(g, node, region, em)] += 1
    for reshape in region.reshapes:
        bypass(g, reshape)
        counts["removed NCHWc block-view Reshape"] += 1
    for tensor in region.split_tensors:
        tensor.shape = None  # was the 5-D view; now the plain 4-D tensor
    return counts


def _rewrite_conv(node: gs.Node, region: Region, em: Emitter, unblocked: dict) -> None:
    x, weights = node.inputs[0], node.inputs[1]
    key = (id(weights), region.kinds[id(node)], region.trim.get(id(node)))
    if key not in unblocked:
        value = unblock(constant_value(weights), key[1], region.block)
        if key[2] is not None:  # the reader of a ReorderInput that padded its channels
            value = np.ascontiguousarray(value[:, : key[2]])
        unblocked[key] = em.const(f"{weights.name}_oihw", value)
    inputs = [x, unblocked[key]]
    if len(node.inputs) > 2 and not node.inputs[2].is_empty():
        inputs.append(node.inputs[2])
    rest: list[Step] = []
    if len(node.inputs) > 3 and not node.inputs[3].is_empty():
        rest.append(("Add", [node.inputs[3]], {}))
    act = region.acts[id(node)]
    if act is not None:
        rest.append(em.activation_step(act, node.name or node.outputs[0].name, np.dtype("float32")))
    attrs = {k: v for k, v in node.attrs.items() if k not in ("activation", "activation_params")}
    replace_with_chain(em, node, ("Conv", inputs, attrs), rest)


def _resize(node: gs.Node, em: Emitter) -> Step:
    scales = em.const(f"{node.outputs[0].name}_scales",
                      np.array([float(s) for s in node.attrs["scales"]], np.float32))
    mode = str(node.attrs.get("mode", "nearest"))
    attrs = {"mode": mode, "coordinate_transformation_mode":
             str(node.attrs.get("coordinate_transformation_mode", "asymmetric"))}
    if mode == "nearest":
        attrs["nearest_mode"] = "floor"
    return "Resize", [node.inputs[0], gs.Variable.empty(), scales], attrs


def _reorder_input(g: gs.Graph, node: gs.Node, region: Region, em: Emitter) -> str:
    c = region.plain[id(node)]
    pad = -(-c // region.block) * region.block - c
    channels_last = int(node.attrs.get("channels_last", 0))
    steps: list[Step] = []
    if channels_last:
        steps.append(("Transpose", [], {"perm": [0, 3, 1, 2]}))
    if pad and _trimmable(node.outputs[0], region):
        for reader in node.outputs[0].outputs:
            region.trim[id(reader)] = c
    elif pad:
        steps.append(_channel_pad(node, pad, em))
    if not steps:
        bypass(g, node)
        return "removed ReorderInput" + (" (readers' padded input channels cut)" if pad else "")
    first_op, first_extra, first_attrs = steps[0]
    replace_with_chain(em, node, (first_op, [node.inputs[0], *first_extra], first_attrs), steps[1:])
    return "rewrote ReorderInput as " + " + ".join(op for op, _, _ in steps)


def _trimmable(tensor: gs.Tensor, region: Region) -> bool:
    """Every reader is a group-1 NCHWc Conv reading `tensor` as its data input only."""
    return all(
        is_nchwc(r) and r.op == "Conv" and region.kinds.get(id(r)) == "BiBo"
        and int(r.attrs.get("group", 1)) == 1 and r.inputs[0] is tensor
        and all(t is not tensor for t in r.inputs[1:])
        for r in tensor.outputs
    )


def _channel_pad(node: gs.Node, pad: int, em: Emitter) -> Step:
    """Zeros after the channels (axis 1 of a 4-D tensor), as ReorderInput pads them."""
    pads = [0, 0, 0, 0, 0, pad, 0, 0]
    if em.opset < 11:
        return "Pad", [], {"pads": pads, "mode": "constant"}
    return "Pad", [em.const(f"{node.outputs[0].name}_pads", np.array(pads, np.int64))], {}


def _reorder_output(g: gs.Graph, node: gs.Node, region: Region, em: Emitter) -> str:
    channels = int(node.attrs["channels"])
    steps: list[Step] = []
    cpad = region.cpads[id(node)]
    if cpad is None or cpad(region.block) != channels:
        steps.append(_slice(node, channels, em))
    if int(node.attrs.get("channels_last", 0)):
        steps.append(("Transpose", [], {"perm": [0, 2, 3, 1]}))
    if not steps:
        if bypass(g, node) is None:
            return "removed ReorderOutput"
        steps.append(("Identity", [], {}))
    first_op, first_extra, first_attrs = steps[0]
    replace_with_chain(em, node, (first_op, [node.inputs[0], *first_extra], first_attrs), steps[1:])
    return "rewrote ReorderOutput as " + " + ".join(op for op, _, _ in steps)


def _slice(node: gs.Node, channels: int, em: Emitter) -> Step:
    if em.opset < 10:
        return "Slice", [], {"starts": [0], "ends": [channels], "axes": [1]}
    base = node.outputs[0].name
    bounds = [em.const(f"{base}_{k}", np.array([v], np.int64))
              for k, v in (("starts", 0), ("ends", channels), ("axes", 1))]
    return "Slice", bounds, {}
