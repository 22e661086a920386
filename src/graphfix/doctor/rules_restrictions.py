"""The operator matrix's restriction texts, checked where attributes, shapes, types and
constants settle them.

Each restriction text of the target's matrix is split into sentences. A sentence that
one of the checkers below recognizes is checked on every node of that op, subgraph
nodes included: a violation is `restriction-violated` (error; warn for "`seed` value is
ignored") with the precise reason, a sentence met says nothing. A sentence no checker
recognizes, or one the model does not settle (a shape that inference left unknown, a value
known only at run time), is `restriction-unchecked` (info) with the sentence verbatim.
The checkers match the sentence text, so a restriction applies exactly to the TensorRT
versions whose matrix states it. Findings are per node; the engine groups those that
say the same (`findings.grouped`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from graphfix.doctor import restriction_attrs as attrs
from graphfix.doctor import restriction_checks as checks
from graphfix.doctor import restriction_graphs as graphs
from graphfix.doctor.findings import ERROR, INFO, WARN, Finding
from graphfix.doctor.restriction_checks import UNKNOWN, Checker
from graphfix.doctor.rules_ops import supported_nodes
from graphfix.doctor.view import ModelView
from graphfix.trt import TrtTarget

FOLD = "fold-constants (then fix-shapes if the value depends on a dynamic shape)"
STATIC = "fix-shapes{INPUT=DIMS} with the sizes you will run, then fold-constants"
EINSUM = ("lower-unsupported (graphfix run --trt VERSION): an ellipsis that leads every "
          "operand and the output becomes MatMul/Transpose/Reshape; other equations need a "
          "re-export without the ellipsis")
BRANCHES = ("outputs named alike: lower-unsupported (graphfix run --trt VERSION) renames the "
            "else branch's; other shapes or ranks: "
            f"{STATIC}: an If whose condition becomes a constant is replaced by the branch "
            "it takes")
DROPOUT = ("fold-constants, then eliminate-noops (removes a Dropout whose training_mode is "
           "false); a Dropout in training mode has to go before export")
CHANGE = "change the model so the node meets the restriction (re-export with other settings)"
CUBIC = ("lower-unsupported (graphfix run --trt VERSION) writes a cubic Resize of a float32 "
         "rank-2 or rank-4 input (the last two axes) as Gather/Mul/Add; otherwise re-export "
         "with mode linear")


@dataclass(frozen=True)
class Restriction:
    """Sentences matching `pattern` (case-insensitive), the checker that decides them,
    and the fix a violation names."""

    pattern: str
    check: Checker
    fix: str = CHANGE


RESTRICTIONS: tuple[Restriction, ...] = (
    Restriction(r"^(\d)D or (\d)D (?:pooling|convolutions|deconvolutions) only$",
                checks.spatial_dims),
    Restriction(r"^`input` must have (\d)D or (\d)D spatial dimensions$", checks.spatial_dims),
    Restriction(r"^`axis` dimension of input must be a build-time constant$",
                checks.static_axis, STATIC),
    Restriction(r"must be (?:an? )?(?:initiali[sz]ers?|initailizer|constant tensor|"
                r"resolvable to a constant|build-time constant)$", checks.must_be_constant,
                FOLD),
    Restriction(r"^`(\w+)` must be (INT64|INT32|FLOAT|BOOL)$", checks.element_type),
    Restriction(r"must be (\d)D$", checks.named_ranks),
    Restriction(r"^Input must be 4D input$", checks.rank_between(4, 4)),
    Restriction(r"^Input rank must be >=3 & <=5$", checks.rank_between(3, 5)),
    Restriction(r"^`input` must have static dimensions$|^Dynamic input shapes are unsupported$",
                checks.static_input, STATIC),
    Restriction(r"^Only positive indices \(>=0\) are supported$", checks.non_negative_indices),
    # the advice after "Only positive indices": that sentence decides it
    Restriction(r"^Compile with `-DSUPPORT_NEGATIVE_GATHER=1`", checks.reported_elsewhere),
    Restriction(r"^`K` input must be less than (\d+)$", checks.k_below),
    Restriction(r"^`is_tra(?:i)?ning` must be an initializer and evaluate to False$",
                checks.training_false, DROPOUT),
    Restriction(r"^Input must be real-valued$", checks.real_valued),
    Restriction(r"^Floating point inputs are only supported if .* are initializers$",
                checks.float_range_constant, FOLD),
    Restriction(r"^`dilations` must be empty or all ones$", attrs.dilations),
    Restriction(r"^`Indices` output tensor unsupported$|^Only the first output `Y` is supported$",
                attrs.outputs_beyond_first),
    Restriction(r"^`(\w+)`(?: attribute)? must be (-?\d+)$", attrs.attr_equals),
    # zero points: rules_qdq's qdq-zero-point reports them, once per op type
    Restriction(r"^`x_zero_point` must be zero$", checks.reported_elsewhere),
    Restriction(r"^`reduction` (?:other than `none` )?is not supported$", attrs.reduction_none),
    Restriction(r"^`seed` value is ignored by TensorRT$", attrs.seed_ignored),
    Restriction(r"^Supported (resize) modes", attrs.resize_mode, CUBIC),
    Restriction(r"^Supported (resize transformation|resize|nearest|aspect ratio) "
                r"(?:modes|policy)", attrs.resize_mode),
    Restriction(r"^Antialiasing is not supported$", attrs.no_antialias),
    Restriction(r"^When `scales` is a tensor input, `axes` must be an iota vector",
                attrs.resize_axes_iota),
    Restriction(r"^`sparse_value`, `value_string`, and `value_strings` attributes are "
                r"unsupported$", attrs.constant_attrs),
    Restriction(r"^For bidirectional (?:LSTM|GRU|RNN)s, activation functions must be the same",
                attrs.same_activations),
    Restriction(r"attributes are unsupported$", attrs.attrs_unsupported),
    Restriction(r"inputs are unsupported$", attrs.inputs_unsupported),
    Restriction(r"outputs are unsupported$", attrs.outputs_unsupported),
    Restriction(r"attributes are supported via being specified as the second dimension",
                attrs.heads_from_shapes),
    Restriction(r"^`pads` for the beginning and end along each spatial axis must be the same$",
                attrs.symmetric_pads),
    Restriction(r"^Ellipsis and diagonal operations are not supported$", attrs.einsum_plain,
                EINSUM),
    Restriction(r"^Broadcasting between inputs is not supported$", attrs.einsum_no_broadcast),
    Restriction(r"^Zero-constant padding on two dimensions only$", attrs.zero_padding_two_dims),
    # a behaviour, not a condition: nms-strategy quotes the parser notes on it
    Restriction(r"^Output has fixed shape and is padded to", checks.reported_elsewhere),
    Restriction(r"^Output tensors of the two conditional branches must have "
                r"(?:the same rank|broadcastable shapes)", graphs.if_branches, BRANCHES),
    Restriction(r"^Scan output length cannot be dynamic$", graphs.loop_scan_length),
    Restriction(r"^The shape of Loop carried dependencies must be the same",
                graphs.loop_carried_shapes),
)
_COMPILED = tuple((re.compile(r.pattern, re.IGNORECASE), r) for r in RESTRICTIONS)


def sentences(text: str) -> list[str]:
    """A restriction text as the sentences it states, verbatim (no trailing period)."""
    parts = re.split(r"\n|(?<=[A-Za-z0-9`\]])\. ", text)
    return [p.strip().rstrip(".").strip() for p in parts if p.strip().rstrip(".").strip()]


def restrictions(view: ModelView, target: TrtTarget) -> Iterator[Finding]:
    for ref, row in supported_nodes(view, target):
        for sentence in sentences(row.restrictions):
            found = restriction_for(sentence)
            verdict = UNKNOWN if found is None else found[0].check(ref, view, found[1])
            fact = f"matrix {row.matrix}, {ref.op} restriction: {sentence}"
            if verdict == UNKNOWN:
                yield Finding(
                    "restriction-unchecked", INFO,
                    f"{ref.op}: TensorRT states a restriction doctor cannot check from the "
                    "model alone", nodes=(ref.label,), op=ref.op, fact=fact,
                    fix="check that the model meets it")
            elif verdict is not None:
                yield Finding(
                    "restriction-violated", WARN if "ignored" in sentence else ERROR,
                    f"{ref.op}: {verdict}", nodes=(ref.label,), op=ref.op, fact=fact,
                    fix=found[0].fix)


def restriction_for(sentence: str) -> tuple[Restriction, re.Match] | None:
    """The first restriction whose pattern the sentence matches, with the match."""
    for pattern, restriction in _COMPILED:
        match = pattern.search(sentence)
        if match:
            return restriction, match
    return None
