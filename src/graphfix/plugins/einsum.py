"""Einsum's lowering (`plugins.lowering`): a (batched) matrix multiply or a transpose.

    Einsum(A, B) "bij,bjk->bik"  = [Transpose] MatMul(Transpose?(A), Transpose?(B)) [Transpose]
    Einsum(A) "ij->ji"           = Transpose(A)  (Identity when the order does not change)

One contracted letter, one letter kept from each operand, batch letters in both, an
ellipsis leading everywhere; anything else is left with the reason. `einsum_restricted`
reads a target row's restrictions text (an ellipsis the row excludes).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import onnx_graphsurgeon as gs

if TYPE_CHECKING:
    from graphfix.plugins.lowering import Builder, Emit, Env


def rank_of(t: gs.Tensor) -> int | None:
    """A tensor's rank, None when its shape is unknown."""
    return len(t.shape) if t.shape is not None else None


_TOKEN = re.compile(r"\.\.\.|[A-Za-z]")
ELLIPSIS = "..."


def parse_einsum(equation: str, operands: int) -> tuple[list[list[str]], list[str]] | str:
    """(letters of each operand, letters of the output), ELLIPSIS as one token; the output
    of an implicit equation is the letters used once, sorted, after any ellipsis."""
    text = equation.replace(" ", "")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    parsed = [_TOKEN.findall(t) for t in terms + ([rhs] if arrow else [])]
    if any("".join(p) != t for p, t in zip(parsed, terms + [rhs], strict=False)):
        return f"its equation '{equation}' is not one this pass can read"
    if len(terms) != operands:
        return f"its equation '{equation}' names {len(terms)} operands, not {operands}"
    ins = parsed[:len(terms)]
    if arrow:
        return ins, parsed[-1]
    letters = [c for t in ins for c in t if c != ELLIPSIS]
    if len({c.islower() for c in letters}) > 1:
        return f"its implicit equation '{equation}' mixes upper and lower case letters"
    once = sorted(c for c in set(letters) if letters.count(c) == 1)
    return ins, ([ELLIPSIS] if any(ELLIPSIS in t for t in ins) else []) + once


def _perm(have: list[str], want: list[str], rank: int | None) -> list[int] | None | str:
    """The Transpose perm taking letters `have` to `want` behind a leading ellipsis of
    rank - len(have) axes: None when nothing moves, a reason when the rank is needed."""
    perm = [have.index(c) for c in want]
    if perm == list(range(len(perm))):
        return None
    if rank is None:
        return "an operand with an ellipsis of unknown rank needs a transpose"
    lead = rank - len(have)
    return list(range(lead)) + [lead + p for p in perm]


def einsum(node: gs.Node, env: Env) -> Emit | str:
    parsed = parse_einsum(str(node.attrs.get("equation", "")), len(node.inputs))
    if isinstance(parsed, str):
        return parsed
    ins, out = parsed
    if any(len(set(t)) != len(t) for t in ins + [out]):
        return "it repeats a letter within one term (a diagonal), which is not a matrix multiply"
    has = [ELLIPSIS in t for t in ins + [out]]
    if any(has) and not all(t[:1] == [ELLIPSIS] for t in ins + [out]):
        return "its ellipsis is not the leading term of every operand and of the output"
    strip = [t[1:] if any(has) else t for t in ins + [out]]
    ranks = [rank_of(t) if any(has) else len(s) for t, s in zip(node.inputs, strip, strict=False)]
    if len(ins) == 1:
        return _einsum_transpose(node, strip[0], strip[1], ranks[0])
    if len(ins) == 2:
        return _einsum_matmul(node, strip, ranks)
    return f"it has {len(ins)} operands; only 1 (a transpose) or 2 (a matrix multiply) lower"


def _einsum_transpose(node: gs.Node, have: list[str], out: list[str],
                      rank: int | None) -> Emit | str:
    if sorted(have) != sorted(out):
        return "it sums over a letter of its one operand, which is not a transpose"
    perm = _perm(have, out, rank)
    if isinstance(perm, str):
        return perm
    x, y = node.inputs[0], node.outputs[0]

    def emit(b: Builder) -> None:
        if perm is None:
            b.node("Identity", [x], out=y)
        else:
            b.node("Transpose", [x], {"perm": perm}, out=y)

    return emit


def _einsum_matmul(node: gs.Node, terms: list[list[str]], ranks: list[int | None]) -> Emit | str:
    a, bt, out = terms
    sa, sb, so = set(a), set(bt), set(out)
    if not so <= sa | sb:
        return "its output names a letter that no operand has"
    summed = (sa ^ sb) - so
    if summed:
        return (f"it sums over {', '.join(sorted(summed))} of one operand alone, "
                "which is not a matrix multiply")
    k, m, n = (sa & sb) - so, sa - sb, sb - sa
    if (len(k), len(m), len(n)) != (1, 1, 1):
        return (f"it is not a (batched) matrix multiply: it contracts {len(k)} letters and "
                f"keeps {len(m)} of the first and {len(n)} of the second operand alone "
                "(a MatMul needs 1, 1 and 1)")
    batch = [c for c in out if c in sa & sb]
    (kc,), (mc,), (nc,) = k, m, n
    lead = None if None in ranks else max(r - len(t) for r, t in zip(ranks, (a, bt), strict=True))
    perms = [_perm(a, batch + [mc, kc], ranks[0]), _perm(bt, batch + [kc, nc], ranks[1]),
             _perm(batch + [mc, nc], out, None if lead is None else lead + len(out))]
    reason = next((p for p in perms if isinstance(p, str)), None)
    if reason:
        return reason
    (x1, x2), y = node.inputs, node.outputs[0]
    dt = y.dtype

    def emit(b: Builder) -> None:
        left = x1 if perms[0] is None else b.node("Transpose", [x1], {"perm": perms[0]},
                                                  dtype=dt)
        right = x2 if perms[1] is None else b.node("Transpose", [x2], {"perm": perms[1]},
                                                   dtype=dt)
        product = b.node("MatMul", [left, right], out=y if perms[2] is None else None, dtype=dt)
        if perms[2] is not None:
            b.node("Transpose", [product], {"perm": perms[2]}, out=y)

    return emit


def einsum_restricted(node: gs.Node, env: Env, text: str) -> str | None:
    """What of the row's restrictions text this node meets: an ellipsis, a diagonal, or
    static shapes that broadcast one input against the other."""
    lowered = text.lower()
    parsed = parse_einsum(str(node.attrs.get("equation", "")), len(node.inputs))
    if isinstance(parsed, str):
        return None
    ins, _ = parsed
    if "ellipsis" in lowered and any(ELLIPSIS in t for t in ins):
        return f"its equation has an ellipsis, and the table says: {text}"
    if "diagonal" in lowered and any(len(set(t)) != len(t) for t in ins):
        return f"its equation takes a diagonal, and the table says: {text}"
    if "broadcasting between inputs" in lowered and _broadcasts(node, ins):
        return f"its inputs broadcast against each other, and the table says: {text}"
    return None


def _broadcasts(node: gs.Node, ins: list[list[str]]) -> bool:
    sizes: dict[str, set[int]] = {}
    for term, t in zip(ins, node.inputs, strict=False):
        if t.shape is None or ELLIPSIS in term or len(t.shape) != len(term):
            continue
        for c, d in zip(term, t.shape, strict=True):
            if isinstance(d, int):
                sizes.setdefault(c, set()).add(d)
    return any(len(s) > 1 for s in sizes.values())
