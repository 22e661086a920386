"""The operator matrix's restriction texts, checked where attributes and shapes settle them.

Each restriction text of the target's matrix is split into sentences. A sentence
that one of the checkers below recognizes is checked on every node of that op:
a violation is `restriction-violated` (error; warn for "`seed` value is ignored").
A sentence no checker recognizes, or one whose answer depends on values known
only at run time, is `restriction-unchecked` (info) with the sentence verbatim,
once per op and sentence, naming the nodes. The checkers match the sentence
text, so a restriction applies exactly to the TensorRT versions whose matrix
states it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import onnx

from graphfix.doctor.findings import ERROR, INFO, WARN, Finding
from graphfix.doctor.rules_ops import supported_nodes
from graphfix.doctor.view import ModelView, NodeRef
from graphfix.trt import TrtTarget

UNKNOWN = "unknown"  # a checker's answer when the model does not settle it
Checker = Callable[[NodeRef, ModelView, re.Match], str | None]  # violation text, None, UNKNOWN


def sentences(text: str) -> list[str]:
    """A restriction text as the sentences it states, verbatim (no trailing period)."""
    parts = re.split(r"\n|(?<=[a-z0-9`\]])\. ", text)
    return [p.strip().rstrip(".").strip() for p in parts if p.strip().rstrip(".").strip()]


def restrictions(view: ModelView, target: TrtTarget) -> Iterator[Finding]:
    unchecked: dict[tuple[str, str], list[str]] = {}
    for ref, row in supported_nodes(view, target):
        if not row.restrictions:
            continue
        for sentence in sentences(row.restrictions):
            found = _checker(sentence)
            verdict = UNKNOWN if found is None else found[0](ref, view, found[1])
            if verdict is None:
                continue
            if verdict == UNKNOWN:
                unchecked.setdefault((ref.op, sentence), []).append(ref.label)
                continue
            severity = WARN if "ignored" in sentence else ERROR
            yield Finding(
                "restriction-violated", severity, f"{ref.op}: {verdict}",
                nodes=(ref.label,), op=ref.op,
                fact=f"matrix {row.matrix}, {ref.op} restriction: {sentence}",
                fix=_fix(ref.op, sentence),
            )
    for (op, sentence), nodes in unchecked.items():
        yield Finding(
            "restriction-unchecked", INFO,
            f"{op}: TensorRT states a restriction doctor cannot check from the model alone",
            nodes=tuple(nodes), op=op,
            fact=f"matrix {target.version}, {op} restriction: {sentence}",
            fix="check that the model meets it",
        )


def _fix(op: str, sentence: str) -> str:
    if "initiali" in sentence or "constant" in sentence:
        return "fold-constants (then fix-shapes if the value depends on a dynamic shape)"
    if op in ("Dropout",):
        return "eliminate-noops (removes inference Dropout)"
    return "change the model so the node meets the restriction (re-export with other settings)"


# ----------------------------------------------------------------------------- checkers


def _spatial_rank(ref: NodeRef, view: ModelView) -> int | None:
    kernel = ref.attr("kernel_shape")
    if kernel:
        return len(kernel)
    for name in (ref.input(1) if ref.op in ("Conv", "ConvTranspose") else "", ref.input(0)):
        shape = view.shape(name) if name else None
        if shape is not None:
            return len(shape) - 2
    return None


def _two_or_three_d(ref, view, match) -> str | None:
    rank = _spatial_rank(ref, view)
    if rank is None:
        return UNKNOWN
    return None if rank in (2, 3) else f"{rank}-D {ref.op} (only 2-D or 3-D are supported)"


def _input_index(ref: NodeRef, view: ModelView, name: str) -> int | None:
    try:
        schema = onnx.defs.get_schema(ref.op, max(view.opset, 1), "")
    except onnx.defs.SchemaError:
        return None
    names = [i.name for i in schema.inputs]
    return names.index(name) if name in names else None


def _must_be_constant(ref, view, match) -> str | None:
    names = re.findall(r"`(\w+)\s*`", match.string)
    bad, known = [], False
    for name in names:
        index = _input_index(ref, view, name)
        if index is None:
            continue  # an attribute (constant by nature) or an input this opset lacks
        known = True
        tensor = ref.input(index)
        if tensor and not view.is_constant(tensor):
            bad.append(f"`{name}` ('{tensor}')")
    if bad:
        return f"{', '.join(bad)} is computed at run time, the parser needs a constant"
    return None if known or names else UNKNOWN


def _dilations(ref, view, match) -> str | None:
    dilations = ref.attr("dilations")
    return None if not dilations or all(d == 1 for d in dilations) else (
        f"dilations {list(dilations)}")


def _second_output_unsupported(ref, view, match) -> str | None:
    used = [o for o in ref.node.output[1:] if o]
    return f"output(s) {used} are used" if used else None


def _attr_equals(ref, view, match) -> str | None:
    name, wanted = match.group(1), int(match.group(2))
    if _input_index(ref, view, name) is not None:
        return None  # zero points: rules_qdq reports them (qdq-zero-point), once
    defaults = {"sorted": 1}
    value = ref.attr(name, defaults.get(name, 0))
    if isinstance(value, int):
        return None if value == wanted else f"`{name}` is {value}"
    return UNKNOWN


def _k_below(ref, view, match) -> str | None:
    value = view.value(ref.input(1)) if ref.input(1) else None
    if value is None:
        return UNKNOWN if ref.input(1) else None
    k = int(value.reshape(-1)[0])
    return None if k < int(match.group(1)) else f"K is {k}"


def _reduction_none(ref, view, match) -> str | None:
    value = ref.attr("reduction", b"none")
    value = value.decode() if isinstance(value, bytes) else str(value)
    return None if value == "none" else f"reduction is '{value}'"


def _seed_ignored(ref, view, match) -> str | None:
    return "its `seed` is set but TensorRT ignores it" if ref.has_attr("seed") else None


_RESIZE = {"resize transformation": ("coordinate_transformation_mode", "half_pixel"),
           "resize": ("mode", "nearest"), "nearest": ("nearest_mode", "round_prefer_floor"),
           "aspect ratio": ("keep_aspect_ratio_policy", "stretch")}


def _resize_mode(ref, view, match) -> str | None:
    attr, default = _RESIZE[match.group(1)]
    allowed = re.findall(r"`(\w+)`", match.string)
    value = ref.attr(attr, default)
    value = value.decode() if isinstance(value, bytes) else str(value)
    if attr == "nearest_mode":
        mode = ref.attr("mode", b"nearest")
        if (mode.decode() if isinstance(mode, bytes) else mode) != "nearest":
            return None
    return None if value in allowed else f"{attr} is '{value}'"


def _no_antialias(ref, view, match) -> str | None:
    return "antialias is 1" if ref.attr("antialias", 0) else None


def _training_false(ref, view, match) -> str | None:
    name = ref.input(2)
    if not name:
        return None
    value = view.value(name)
    if value is None:
        return "`training_mode` is not a constant"
    return "`training_mode` is true" if bool(value.reshape(-1)[0]) else None


def _rank(low: int, high: int) -> Checker:
    def check(ref, view, match) -> str | None:
        shape = view.shape(ref.input(0))
        if shape is None:
            return UNKNOWN
        return None if low <= len(shape) <= high else f"its input has rank {len(shape)}"
    return check


def _static_input(ref, view, match) -> str | None:
    shape = view.shape(ref.input(0))
    if shape is None:
        return UNKNOWN
    dynamic = [i for i, d in enumerate(shape) if not isinstance(d, int)]
    return f"input dimensions {dynamic} are dynamic" if dynamic else None


def _constant_attrs(ref, view, match) -> str | None:
    bad = [a for a in ("sparse_value", "value_string", "value_strings") if ref.has_attr(a)]
    return f"it uses {', '.join(bad)}" if bad else None


def _non_negative_indices(ref, view, match) -> str | None:
    value = view.value(ref.input(1))
    if value is None:
        return UNKNOWN
    return "it has negative indices" if value.size and int(value.min()) < 0 else None


_CHECKERS: tuple[tuple[str, Checker], ...] = (
    (r"^2D or 3D (?:pooling|convolutions|deconvolutions) only$", _two_or_three_d),
    (r"must be (?:an? )?(?:initiali[sz]ers?|initailizer|constant tensor|"
     r"resolvable to a constant|build-time constant)$", _must_be_constant),
    (r"^`dilations` must be empty or all ones$", _dilations),
    (r"^`Indices` output tensor unsupported$|^Only the first output `Y` is supported$",
     _second_output_unsupported),
    (r"^`(\w+)`(?: attribute)? must be (-?\d+)$", _attr_equals),
    (r"^`x_zero_point` must be zero$", lambda ref, view, match: None),  # rules_qdq
    (r"^`K` input must be less than (\d+)$", _k_below),
    (r"^`reduction` (?:other than `none` )?is not supported$", _reduction_none),
    (r"^`seed` value is ignored by TensorRT$", _seed_ignored),
    (r"^Supported (resize transformation|resize|nearest|aspect ratio) (?:modes|policy)",
     _resize_mode),
    (r"^Antialiasing is not supported$", _no_antialias),
    (r"^`is_tra(?:i)?ning` must be an initializer and evaluate to False$", _training_false),
    (r"^Input must be 4D input$", _rank(4, 4)),
    (r"^Input rank must be >=3 & <=5$", _rank(3, 5)),
    (r"^`input` must have static dimensions$|^Dynamic input shapes are unsupported$",
     _static_input),
    (r"^`sparse_value`, `value_string`, and `value_strings` attributes are unsupported$",
     _constant_attrs),
    (r"^Only positive indices \(>=0\) are supported$", _non_negative_indices),
)
_COMPILED = tuple((re.compile(p, re.IGNORECASE), c) for p, c in _CHECKERS)


def _checker(sentence: str) -> tuple[Checker, re.Match] | None:
    if "dimension of input" in sentence:  # Hardmax: about a shape, not a constant input
        return None
    for pattern, check in _COMPILED:
        match = pattern.search(sentence)
        if match:
            return check, match
    return None
