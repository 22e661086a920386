"""lower-unsupported: rewrite ops the TensorRT target cannot parse into ops it parses.

    Op(x, ...) -> its exact ONNX decomposition       (graphfix.plugins.lowering, `LOWERINGS`)
    Op(x, ...) -> its ONNX function body, for this node    (graphfix.plugins.function_bodies)

An op without a hand-written lowering that ONNX defines by a function body (opset 23's
RMSNormalization, RotaryEmbedding and Attention, which torch.onnx.export(dynamo=True)
writes; CastLike, Celu, ...) is replaced by that body, built for the node, inlined and
simplified exactly (constant shape arithmetic computed; see that module), where the
target does not list the op (or `ops` names it); a node the target parses is left
without a note.

A node is lowered when the target's operator table (`ctx.trt`, from `graphfix run --trt`)
does not list its op, lists it as unsupported, or supports it with restrictions this
node meets (Einsum with an ellipsis where the row excludes ellipses; LayerNormalization
whose Mean/InvStdDev are read where only `Y` is supported; InstanceNormalization with
non-initializer scale/B or a rank outside the row's range) -- and when every op of the
decomposition is one the target parses, directly or lowered in turn (HardSwish ->
HardSigmoid -> Mul/Add/Min/Max). Otherwise the node stays, with a note saying why. The
option `ops` lowers the op types it names whatever the target says (without a target the
emitted ops are not checked); without a target or `ops` the pass changes nothing.

A node the target parses, but not on its integer or BOOL type (CumSum and NonZero in
every table; ConstantOfShape up to 10.0; ReduceSum up to 10.0; ReduceMin/Max/Prod in
8.x), is computed in float32 (and cast back) where that is exact (`graphfix.plugins.
retype`: a fill float32 holds, sums and extrema of BOOL values, NonZero), or, for a
ReduceMin/Max/Sum/Prod over at most 16 elements of static extent, slice by slice in its
own type (Gathers combined by Min/Max/Add/Mul), or, for an integer Clip (every table lists
Clip for float types only), as Max and Min in its own type; else it is left with a note
saying why.
So is a ConstantOfShape with an FP16 or BF16 value up to 10.0 (every such value is a
float32 one) computed in float32, where the target's Cast row lists that type.

An If whose else branch names an output like the then branch does (optimum's merged
decoders) gets fresh names for those in the else branch, which every table's If row asks
for ("must have different names"; `graphfix.plugins.branches`): names inside a branch are
its own, so nothing computed changes.

A DequantizeLinear of an INT32 constant where the target's row does not list INT32 (the
bias that onnxruntime's quantize_static writes for every Conv and Gemm of a Q/DQ model;
TensorRT quantizes biases itself) becomes the float constant it computes:
(x - zero_point) * scale in float32, as onnxruntime computes it (float32 scales, no
blocks; the output must not be a graph output).

ReduceX ops whose axes come as an input are not rewritten here. Axes moved from an
attribute to an input in the opset where the schema says so (ReduceSum 13, the others
18). A target whose newest parsed opset predates that cannot read the input, but such a
model's opset is also outside the parser's range: the fix is the `opset` pass
(`opset{version=N}`, onnx.version_converter, which moves constant axes back into the
attribute), because writing the attribute form into an opset-18 model would make it
invalid for its declared opset. A target whose row says "`axes` must be an initializer"
gets a note when the axes are not one: `fold-constants` makes a constant expression an
initializer, and axes computed at run time have no static form. Both are notes.

Lowered nodes keep their output tensors (the last node of a decomposition writes them),
so names and dtypes are kept; the disconnected nodes are left for `cleanup`. Each
lowering, with the lowerings of the ops it emitted, is one rewrite for a rewrite budget.
Run it after `normalize-activations`, which fuses x * HardSigmoid(x) back into HardSwish.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper

from graphfix.errors import GraphfixError
from graphfix.graph import (
    all_graphs,
    constant_value,
    is_graph_output,
    is_onnx,
    names_in_use,
    node_label,
    opset_of,
)
from graphfix.graph.dtypes import float_dtype
from graphfix.passes.base import LIMIT_REACHED, Note, Pass, PassContext, PassResult
from graphfix.plugins import branches
from graphfix.plugins.function_bodies import has_body
from graphfix.plugins.lowering import (
    LOWERINGS,
    Emit,
    Env,
    apply,
    emitted_ops,
    lowering_of,
    parses,
    unavailable,
)
from graphfix.plugins.retype import (
    FLOAT_FILLS,
    RETYPES,
    float_fill_refusal,
    retypes,
    typed_dtype,
)
from graphfix.plugins.rules import Rule

REDUCE_OPS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
FORCED = "forced by the option ops"


@dataclass(frozen=True)
class LowerUnsupportedOptions:
    """`ops`: op types to lower whatever the target says, separated by '+' in pipeline
    text (`lower-unsupported{ops=Gelu+LayerNormalization}`; commas separate options
    there) or by commas in Python."""

    ops: str = ""

    def __post_init__(self) -> None:
        newest = onnx.defs.onnx_opset_version()
        unknown = sorted(op for op in self.forced - set(LOWERINGS) if not has_body(op, newest))
        if unknown:
            raise GraphfixError(
                f"Option 'ops' of pass 'lower-unsupported' names {', '.join(unknown)}",
                f"graphfix lowers only {', '.join(LOWERINGS)} and the ops ONNX defines by "
                "a function body (RMSNormalization, RotaryEmbedding, Attention, ...)",
                "write for example lower-unsupported{ops=Gelu+LayerNormalization}",
            )

    @property
    def forced(self) -> frozenset[str]:
        return frozenset(n.strip() for n in self.ops.replace("+", ",").split(",") if n.strip())


@dataclass(frozen=True)
class _Plan:
    """A node to lower: how, and the ops that creates."""

    emit: Emit
    ops: tuple[str, ...]
    note: str = ""  # said about the node when it is lowered (an assumption it makes)


class LowerUnsupported(Pass):
    """Lower LayerNormalization, GroupNormalization (opset 18 per group, 21 per channel),
    InstanceNormalization, Gelu (none, tanh), HardSwish, HardSigmoid, Mish, Softplus,
    matrix-multiply Einsum equations and cubic Resize (Keypoint R-CNN's heatmaps; no
    TensorRT version takes mode cubic) into ops the `--trt` target parses; and any other op
    ONNX defines by a function body (RMSNormalization, RotaryEmbedding, Attention with
    its mask, causal and grouped-query forms, past and present key/values) into its body,
    whose ops the target lacks but that have bodies of their own expanded in turn
    (Attention's CastLike on 8.6).

    Also computes CumSum, ReduceSum/Max/Min/Prod, NonZero and ConstantOfShape in float32
    where the target lists only float types for them and that is exact (RoBERTa's
    position ids, T5's bucket clamp, Mask2Former's mask counts, detectors' NonZero),
    an integer Clip as Max and Min in its own type (DeBERTa-v2's position buckets), and
    an FP16/BF16 ConstantOfShape where the target lists it for FP32 only (fp16 YOLOv8
    heads with a dynamic batch), and stores the INT32 DequantizeLinear of a constant (the
    bias of onnxruntime's Q/DQ models) as the float constant it computes.

    Handles any LayerNormalization axis (a positive one needs the input's rank),
    stash_type (Cast in and out when it differs from the input type), an absent bias,
    read Mean/InvStdDev outputs; float16 models (constants in the model's type); If/Loop/
    Scan bodies. Notes, without a change: the target parses the node natively; the node
    has no exact decomposition (an Einsum that is not a matrix multiply, an unknown float
    type or rank; a function body that cannot be built for the node, or does not compute
    an output something reads, or uses an op that changed its signature since the body's
    opset); an emitted op the target cannot parse; ReduceX axes the target cannot
    read (module docstring); an op the target lacks that has no lowering at all; no
    target and no `ops`. A note on a node left alone says whether a plugin rule
    (substitute-plugins) can replace it; an op lowered where a plugin rule could have
    replaced it gets a note saying why the lowering was chosen and how to get the plugin.
    """

    name = "lower-unsupported"
    summary = ("Rewrite ops the --trt target cannot parse (LayerNormalization, GroupNorm, "
               "Gelu, Mish, HardSwish, Einsum, RMSNormalization, RotaryEmbedding, "
               "Attention, ...) into exact decompositions it parses; option ops=A+B forces "
               "op types.")
    Options = LowerUnsupportedOptions
    option_syntax = "ops=OP+OP (op types lowered whatever --trt says, e.g. ops=Gelu+Mish)"
    counts_rewrites = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        target, forced = ctx.trt, self.options.forced
        if target is None and not forced:
            result.notes.append(Note("graph", "no TensorRT target: give one (graphfix run "
                                     "--trt 8.4), or name op types with lower-unsupported"
                                     "{ops=...}"))
            return result
        opset, names = opset_of(graph), names_in_use(graph)
        plugins, replaceable = _Plugins(opset, ctx.plugin_rules, target), {}
        native: dict[str, list[str]] = {}  # op -> labels of nodes the target parses as they are
        distinct = branches.applies(target)
        for g in list(all_graphs(graph)):
            for node in [n for n in g.nodes if n.outputs and is_onnx(n)]:
                if distinct and node.op == "If" and branches.clashing(node):
                    if ctx.allow_rewrite(self.name, f"{node_label(node)}'s else outputs"):
                        result.counts[BRANCH_NAMES] += branches.rename_else_outputs(node, names)
                    else:
                        result.notes.append(Note(node_label(node), LIMIT_REACHED))
                env = Env(g, opset, float_dtype(node.inputs[0]) if node.inputs else None,
                          target, forced)
                checked = _check(node, env, target, forced, plugins)
                if checked is None:
                    continue
                if checked == NATIVE:
                    native.setdefault(node.op, []).append(node_label(node))
                elif isinstance(checked, _Folded):
                    if ctx.allow_rewrite(self.name, f"{node_label(node)} into a constant"):
                        out = node.outputs[0]
                        out.to_constant(checked.value)
                        out.inputs.clear()
                        result.counts[f"stored {checked.type_name} DequantizeLinear "
                                      "outputs as float constants"] += 1
                    else:
                        result.notes.append(Note(node_label(node), LIMIT_REACHED))
                elif isinstance(checked, str):
                    result.notes.append(Note(node_label(node), checked))
                elif not ctx.allow_rewrite(self.name, f"{node_label(node)} into "
                                                      f"{', '.join(dict.fromkeys(checked.ops))}"):
                    result.notes.append(Note(node_label(node), LIMIT_REACHED))
                else:
                    if rule := plugins.replaceable(node):
                        replaceable.setdefault(node.op, rule)
                    _lower(node, checked, env, names, target, forced, result, plugins)
        result.changed = bool(result.counts)
        result.notes.extend(_native_notes(native, target))
        result.notes.extend(_chosen(op, replaceable[op]) for op in sorted(replaceable))
        result.notes.extend(_opset_note(opset, target))
        if not result.changed and not result.notes:
            what = f"for {target.label()}" if target is not None else "of the forced op types"
            result.notes.append(Note("graph", f"no node to lower {what}"))
        return result


BRANCH_NAMES = "renamed If else-branch outputs named like the then branch's"
"""The count of `branches.rename_else_outputs` (TensorRT's If restriction)."""

NATIVE = "parses it natively"
"""`_check`'s answer for a node with a lowering that the target parses as it is: one note
per op type (mobilenet_v3 has 28 HardSwish/HardSigmoid nodes; a note each buried the
notes that matter)."""


def _native_notes(native: dict[str, list[str]], target) -> list[Note]:
    notes = []
    for op, labels in native.items():
        subject = labels[0] if len(labels) == 1 else f"{op} ({len(labels)} nodes)"
        notes.append(Note(subject, f"{target.label()} {NATIVE}"))
    return notes


def _check(node: gs.Node, env: Env, target, forced: frozenset[str], plugins: _Plugins
           ) -> _Plan | str | None:
    """What to do with one node: a plan, a note, or None (nothing to say)."""
    lowering = lowering_of(node.op, env.opset)
    if node.op in forced and lowering is None:
        return (f"{FORCED}, but ONNX defines {node.op} by no function body at opset "
                f"{env.opset}")
    if node.op in forced:
        why = FORCED
    elif target is None:
        return None
    elif node.op == "DequantizeLinear":
        return _dequantized_constant(node, env, target)
    elif node.op in RETYPES and parses(target, node.op):
        return _retype(node, env, target)
    elif lowering is None:
        return _no_lowering(node, env, target, plugins)
    else:
        row = target.op(node.op)
        if row is not None and row.supported and node.op not in LOWERINGS:
            return None  # a function body, offered only where the target lacks the op
        if row is not None and row.supported:
            why = lowering.restricted(node, env, row.restrictions) if row.restrictions else None
            if why is None:
                return NATIVE
        else:
            why = (f"{target.label()} " + ("does not list it" if row is None
                                           else "lists it as unsupported"))
    assert lowering is not None, "forced ops are checked by the options"
    emit = lowering.plan(node, env)
    if isinstance(emit, str):
        return f"{why}, but it has no exact lowering: {emit}" + plugins.instead(node)
    ops = emitted_ops(emit, env)
    missing = unavailable(ops, target) if target is not None else []
    if missing:
        return (f"{why}, but its lowering emits {', '.join(missing)}, which "
                f"{target.label()} neither parses nor can lower" + plugins.instead(node))
    return _Plan(emit, ops)


def _retype(node: gs.Node, env: Env, target) -> _Plan | str | None:
    """A node of a `RETYPES` op on a type its supported row does not list: computed in
    float32 where that is exact (`graphfix.plugins.retype`), else why not."""
    row, dtype = target.op(node.op), typed_dtype(node)
    if dtype is None:
        return None
    try:
        elem = helper.np_dtype_to_tensor_dtype(dtype)
    except (KeyError, TypeError, ValueError):
        return None
    unlisted = target.unlisted_type(node.op, elem)
    if unlisted is None or not retypes(node.op, unlisted):
        return None  # a listed type, or one without a planner (DOUBLE: doctor's cast-down)
    why = (f"{target.label()} lists {node.op} for {', '.join(row.types)} only, "
           f"not {unlisted}")
    if unlisted in FLOAT_FILLS and (refused := float_fill_refusal(target, unlisted)):
        return f"{why}, and it cannot be computed in float32 here: {refused}"
    planned = RETYPES[node.op](node, env)
    if isinstance(planned, str):
        how = "with Max and Min in its own type" if node.op == "Clip" else "in float32"
        return f"{why}, and it cannot be computed {how} exactly: {planned}"
    emit, note = planned
    ops = emitted_ops(emit, env)
    missing = unavailable(ops, target)
    if missing:
        return (f"{why}, and its exact form needs {', '.join(missing)}, which "
                f"{target.label()} does not parse")
    return _Plan(emit, ops, note)


@dataclass(frozen=True)
class _Folded:
    """A DequantizeLinear to replace by the constant it computes."""

    value: np.ndarray
    type_name: str


def _dequantized_constant(node: gs.Node, env: Env, target) -> _Folded | str | None:
    """A DequantizeLinear of a constant of a type the target's row does not list, as the
    float32 constant it computes (module docstring), else why not; None when the row lists
    the type or the input is not a constant (doctor says what to do then)."""
    x = node.inputs[0]
    value = constant_value(x)
    if value is None or value.dtype.kind not in "iu":
        return None
    try:
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    except (KeyError, TypeError, ValueError):
        return None
    unlisted = target.unlisted_type("DequantizeLinear", elem)
    if unlisted != "INT32":  # a bias; a weight's type (UINT8) is a quantization choice
        return None
    why = f"{target.label()} lists DequantizeLinear for {', '.join(target.op(node.op).types)} only"
    scale = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
    zero = constant_value(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2].name else None
    if scale is None or (len(node.inputs) > 2 and node.inputs[2].name and zero is None):
        return f"{why}, and its scale or zero point is not a constant"
    if scale.dtype != np.float32:
        return f"{why}, and its scale is {scale.dtype}, not float32"
    if int(node.attrs.get("block_size", 0)):
        return f"{why}, and it dequantizes in blocks"
    if is_graph_output(env.graph, node.outputs[0]):
        return f"{why}, and its output is a graph output"
    axis = int(node.attrs.get("axis", 1))
    if scale.ndim == 1 and scale.size > 1 and value.ndim > 0:  # per axis
        axis = axis + value.ndim if axis < 0 else axis
        if not 0 <= axis < value.ndim or value.shape[axis] != scale.size:
            return f"{why}, and its scale does not fit axis {axis} of {list(value.shape)}"
        shape = [1] * value.ndim
        shape[axis] = scale.size
        scale = scale.reshape(shape)
        zero = zero.reshape(shape) if zero is not None and zero.size > 1 else zero
    elif scale.size != 1:
        return f"{why}, and its scale has a shape it does not handle: {list(scale.shape)}"
    shifted = value.astype(np.int64) - (zero.astype(np.int64) if zero is not None else 0)
    folded = shifted.astype(np.float32) * scale.astype(np.float32)
    return _Folded(np.asarray(folded, np.float32), unlisted)


def _lower(node: gs.Node, plan: _Plan, env: Env, names: set[str], target,
           forced: frozenset[str], result: PassResult, plugins: _Plugins) -> None:
    """Apply the plan, then lower the emitted nodes the target cannot parse (or forced)."""
    op, label = node.op, node_label(node)
    for new in apply(node, plan.emit, env, names):
        if new.op in forced or (target is not None and not parses(target, new.op)):
            sub_env = Env(env.graph, env.opset,
                          float_dtype(new.inputs[0]) if new.inputs else None, target, forced)
            checked = _check(new, sub_env, target, forced, plugins)
            if isinstance(checked, _Plan):
                _lower(new, checked, sub_env, names, target, forced, result, plugins)
            elif checked:
                result.notes.append(Note(node_label(new), checked))
    if plan.note:
        result.notes.append(Note(label, plan.note))
    result.counts[f"lowered {op} into {', '.join(dict.fromkeys(plan.ops))}"] += 1


def _no_lowering(node: gs.Node, env: Env, target, plugins: _Plugins) -> str | None:
    if node.op in REDUCE_OPS:
        return _reduce_axes(node, env, target)
    if parses(target, node.op):
        return None
    return (f"{target.label()} does not parse it, and graphfix has no exact lowering for it"
            + plugins.instead(node))


class _Plugins:
    """The plugin rules (built-in, entry points, the run's --plugin-rules) that replace a
    whole op, for notes on the other way out: where a node cannot be lowered, whether
    substitute-plugins can replace it; where a node was lowered though a plugin could
    have replaced it, which was chosen and why. Loaded on first use."""

    def __init__(self, opset: int, extra, target) -> None:
        self._opset, self._extra, self._target = opset, tuple(extra), target
        self._rules: list | None = None

    def verdict(self, node: gs.Node) -> tuple[Rule | None, str]:
        """(the first rule replacing this node's op itself, why it cannot here or ""); a
        rule for a decomposed form, anchored at one of its ops, does not count."""
        if self._rules is None:
            from graphfix.plugins.user import all_rules

            self._rules = all_rules(self._opset, self._extra)
        op = node.op
        for rule in self._rules:
            if rule.anchor != op or rule.domain not in ("", "ai.onnx") or (
                    rule.native and op not in rule.native):
                continue
            match = rule.pattern(node)
            if match is None:
                continue
            return rule, rule.plugin_status(self._target) or rule.check(match) or ""
        return None, ""

    def instead(self, node: gs.Node) -> str:
        """A note's ending: what substitute-plugins can do for a node not lowered."""
        if self._target is None:  # forced op types: no target to judge a plugin by
            return ""
        rule, why = self.verdict(node)
        if rule is None:
            return "; no plugin rule replaces it either"
        if why:
            return f"; the plugin rule {rule.name} cannot either: {why}"
        return (f"; substitute-plugins replaces it by the plugin {rule.plugin} (rule "
                f"{rule.name}), as the default --trt pipeline does after this pass")

    def replaceable(self, node: gs.Node) -> Rule | None:
        """The rule that could have replaced a node about to be lowered, else None."""
        rule, why = self.verdict(node) if self._target is not None else (None, "")
        return rule if rule is not None and not why else None


def _chosen(op: str, rule: Rule) -> Note:
    """Why an op was lowered where a plugin rule could have replaced it."""
    return Note("graph", (
        f"{op}: lowered to ONNX ops rather than replaced by the plugin {rule.plugin} (rule "
        f"{rule.name}): the lowering needs no plugin library to build or run the engine, "
        "and onnxruntime checks it; for the plugin's kernel instead, run "
        f"substitute-plugins{{force=true,select={rule.name}}} before this pass"))


@cache
def _axes_input_since(op: str) -> int | None:
    """The first opset in which `op` takes its axes as an input (ONNX's schemas)."""
    for version in range(1, onnx.defs.onnx_opset_version() + 1):
        try:
            schema = onnx.defs.get_schema(op, version)
        except onnx.defs.SchemaError:
            continue
        if any(i.name == "axes" for i in schema.inputs):
            return schema.since_version
    return None


def _reduce_axes(node: gs.Node, env: Env, target) -> str | None:
    """Why the target cannot read this ReduceX's axes input (module docstring), or None."""
    if len(node.inputs) < 2 or node.inputs[1].is_empty():
        return None
    since = _axes_input_since(node.op)
    bounds = target.opset_range
    if since is not None and bounds is not None and bounds[1] < since:
        return (f"its axes are an input (from opset {since}), which {target.label()} cannot "
                f"read: it parses opsets up to {bounds[1]}, where {node.op} takes axes as an "
                f"attribute; opset{{version={bounds[1]}}} (opset{{to-target=true}}, near the end "
                f"of the default --trt pipeline) converts the model and moves constant axes into "
                f"the attribute (not done here: the model declares opset {env.opset})")
    row = target.op(node.op)
    text = row.restrictions if row is not None else ""
    if "`axes` must be an initializer" in text and not isinstance(node.inputs[1], gs.Constant):
        return (f"its axes input is not an initializer, and the table says: {text}; "
                "fold-constants makes a constant expression one, axes computed at run time "
                "have no static form")
    return None


def _opset_note(opset: int, target) -> list[Note]:
    bounds = target.opset_range if target is not None else None
    if bounds is None or opset <= bounds[1]:
        return []
    return [Note("graph", f"the model's opset {opset} is above the {bounds[1]} that "
                          f"{target.label()} parses; opset{{version={bounds[1]}}} after this "
                          "pass converts it (the default --trt pipeline runs "
                          "opset{to-target=true} near its end)")]
