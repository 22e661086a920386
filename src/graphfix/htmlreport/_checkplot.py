"""The error plot of the check report: one mark per compared tensor, topological order.

    x: the tensor's position in the reference's topological order (`TensorResult.order`)
    y: sqnr mode, SQNR in dB (linear, the threshold as a dashed line);
       strict mode, max |candidate - reference| on a log axis

Values a scale cannot place sit in bands at the edges, with their own marks: at the top
an exact tensor's SQNR (inf) or a non-finite error; at the bottom an exact tensor's zero
error (strict) or a NaN/-inf SQNR. The first divergence is a vertical line with its name;
origins are diamonds numbered by rank. Every mark's tooltip names the tensor and value.

With more than `MAX_MARKERS` compared tensors the line still joins every value, but the
marks are thinned to the worst tensor per bucket of consecutive ones (plus the first
divergence and the origins), so thousands of tensors stay a few hundred kB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graphfix.htmlreport._page import Markup, clip_text, esc, fmt
from graphfix.htmlreport._svg import Canvas, Scale, decade_ticks, nice_ticks, num

if TYPE_CHECKING:
    from graphfix.check.layerwise import LayerwiseReport, TensorResult

MAX_MARKERS = 1000
WIDTH, HEIGHT = 1100, 380
LEFT, RIGHT, TOP, BOTTOM = 64, 1082, 40, 330
BAND = 22  # pixels between a band's centre line and the value area


@dataclass(frozen=True)
class Point:
    tensor: TensorResult
    value: float
    place: str  # "value" | "top" | "bottom"


def value_of(t: TensorResult, mode: str) -> float | None:
    return t.sqnr_db if mode == "sqnr" else t.max_abs


def points(report: LayerwiseReport) -> list[Point]:
    """The compared tensors as points, in topological order."""
    out = []
    for t in report.tensors:
        v = value_of(t, report.mode)
        if t.ok is None or v is None:
            continue
        if report.mode == "sqnr":
            place = "value" if math.isfinite(v) else ("top" if v > 0 else "bottom")
        else:
            place = "bottom" if v == 0 else ("value" if math.isfinite(v) else "top")
        out.append(Point(t, v, place))
    return out


def _badness(p: Point, mode: str) -> tuple[bool, float]:
    v = p.value
    if math.isnan(v):
        v = math.inf if mode != "sqnr" else -math.inf
    return (p.tensor.ok is False, -v if mode == "sqnr" else v)


def thin(pts: Sequence[Point], mode: str, keep: set[str]) -> tuple[list[Point], int]:
    """The points that get a mark, and how many tensors each bucket holds (1: all)."""
    if len(pts) <= MAX_MARKERS:
        return list(pts), 1
    size = math.ceil(len(pts) / (MAX_MARKERS // 2))
    chosen = {id(p): p for p in pts if p.tensor.name in keep}
    for start in range(0, len(pts), size):
        worst = max(pts[start:start + size], key=lambda p: _badness(p, mode))
        chosen[id(worst)] = worst
    return sorted(chosen.values(), key=lambda p: p.tensor.order), size


def _y_scale(pts: Sequence[Point], report: LayerwiseReport) -> tuple[Scale, list[float]]:
    finite = [p.value for p in pts if p.place == "value"]
    lo_px, hi_px = BOTTOM - BAND, TOP + BAND
    if report.mode == "sqnr":
        vals = [*finite, report.sqnr_threshold]
        lo, hi = min(vals), max(vals)
        pad = (hi - lo) * 0.06 or 1.0
        return Scale(lo - pad, hi + pad, lo_px, hi_px), nice_ticks(lo - pad, hi + pad, 8)
    lo, hi = (min(finite), max(finite)) if finite else (1e-9, 1.0)
    lo, hi = 10.0 ** math.floor(math.log10(lo)), 10.0 ** math.ceil(math.log10(hi))
    if lo == hi:
        lo, hi = lo / 10, hi * 10
    return Scale(lo, hi, lo_px, hi_px, log=True), decade_ticks(lo, hi)


def _tooltip(p: Point, mode: str, extra: str = "") -> Markup:
    t = p.tensor
    what = f"SQNR {fmt(p.value)} dB" if mode == "sqnr" else f"max abs {fmt(p.value)}"
    verdict = "ok" if t.ok else ("below threshold" if mode == "sqnr" else "out of tolerance")
    lines = [esc(f"#{t.order} {t.name}"), esc(t.node), esc(f"{what} ({verdict})")]
    if extra:
        lines.append(esc(extra))
    return Markup("\n".join(lines))


def _bands(c: Canvas, mode: str, used: set[str]) -> None:
    labels = {"top": "\u221e exact" if mode == "sqnr" else "inf/nan",
              "bottom": "nan/-\u221e" if mode == "sqnr" else "0 exact"}
    for place, y in (("top", TOP + 8), ("bottom", BOTTOM - 8)):
        if place in used:
            c.rect(LEFT, y - 8, RIGHT - LEFT, 16, "band")
            c.text(LEFT - 5, y + 3.5, labels[place], "lab", "end")


def _line(c: Canvas, pts: Sequence[Point], x: Scale, y: Scale) -> None:
    """One path through the finite values, broken where a banded value sits between."""
    parts, pen = [], False
    for p in pts:
        if p.place != "value":
            pen = False
            continue
        parts.append(("L" if pen else "M") + f"{num(x(p.tensor.order))} {num(y(p.value))}")
        pen = True
    if parts:
        c.path("".join(parts), "trace")


def _divergence(c: Canvas, first: TensorResult, x: Scale) -> None:
    px = x(first.order)
    c.line(px, TOP - 4, px, BOTTOM, "fd", f"first divergence: {first.name}")
    right = px > (LEFT + RIGHT) / 2
    c.text(px + (-5 if right else 5), TOP - 8,
           f"first divergence: {clip_text(first.name, 50)}", "fdlab big",
           "end" if right else "start", title=first.name)


def _marks(c: Canvas, shown: Sequence[Point], report: LayerwiseReport, x: Scale,
           y: Scale) -> None:
    rank = {o.name: (i + 1, o) for i, o in enumerate(report.origins)}
    first = report.first_divergence
    for p in shown:
        t = p.tensor
        px = x(t.order)
        py = {"top": TOP + 8, "bottom": BOTTOM - 8}.get(p.place) or y(p.value)
        cls = "ok" if t.ok else "bad"
        if first is not None and t.name == first.name:
            c.marker("circle", px, py, "fdring", _tooltip(p, report.mode, "first divergence"),
                     size=7.5)
        if t.name in rank:
            k, o = rank[t.name]
            tip = f"origin #{k}: error {fmt(o.error)}, amplification {o.describe_amplification()}"
            c.marker("diamond", px, py, "org", _tooltip(p, report.mode, tip), size=4.5)
            if k <= 9:
                near_end = px > RIGHT - 24
                c.text(px + (-9 if near_end else 9), py - 7, str(k), "orglab",
                       "end" if near_end else "start")
        elif p.place == "value":
            c.marker("circle", px, py, cls, _tooltip(p, report.mode))
        else:
            shape = "up" if p.place == "top" else "down"
            c.marker(shape, px, py, f"{cls} edge", _tooltip(p, report.mode), size=4.5)


def plot(report: LayerwiseReport) -> tuple[Markup, int]:
    """The SVG, and the bucket size of the thinned marks (1 when every tensor has one);
    an empty Markup when no tensor was compared."""
    pts = points(report)
    if not pts:
        return Markup(""), 1
    keep = {o.name for o in report.origins}
    if report.first_divergence is not None:
        keep.add(report.first_divergence.name)
    shown, bucket = thin(pts, report.mode, keep)
    what = "SQNR (dB)" if report.mode == "sqnr" else "max abs error (log)"
    c = Canvas(WIDTH, HEIGHT, f"{what} per compared tensor, in topological order", "plot")
    x = Scale(0, max(len(report.tensors) - 1, 1), LEFT + 10, RIGHT - 10)
    y, yticks = _y_scale(pts, report)
    c.y_axis(y, yticks, LEFT, RIGHT, what)
    _bands(c, report.mode, {p.place for p in pts})
    xticks = [t for t in nice_ticks(0, max(len(report.tensors) - 1, 1), 10) if t == int(t)]
    c.x_axis(x, [int(t) for t in xticks], BOTTOM, "tensor (position in topological order)")
    if report.mode == "sqnr":
        ty = y(report.sqnr_threshold)
        c.line(LEFT, ty, RIGHT, ty, "thr", f"threshold {fmt(report.sqnr_threshold)} dB")
        c.text(LEFT + 4, ty - 5, f"threshold {fmt(report.sqnr_threshold)} dB", "thrlab")
    _line(c, pts, x, y)
    if report.first_divergence is not None:
        _divergence(c, report.first_divergence, x)
    _marks(c, shown, report, x, y)
    return c.render(), bucket


STYLE = """
svg.plot .trace{fill:none;stroke:#9aa6bd;stroke-width:1}
svg.plot .band{fill:#f4f5f8}
svg.plot .ok{fill:#3566c8}svg.plot .bad{fill:#d23a2f}
svg.plot .edge.ok{fill:#2e9a48}
svg.plot .org{fill:#f29d12;stroke:#7a4a00;stroke-width:1}
svg.plot .orglab{font-weight:700;fill:#7a4a00}
svg.plot .fdring{fill:none;stroke:#111;stroke-width:1.6}
svg.plot .fd{stroke:#111;stroke-width:1.3;stroke-dasharray:5 3}
svg.plot .fdlab{font-weight:700;fill:#111}
svg.plot .thr{stroke:#d23a2f;stroke-width:1.3;stroke-dasharray:7 4}
svg.plot .thrlab{fill:#b3261e}
.k{font-weight:700}.k.ok{color:#3566c8}.k.bad{color:#d23a2f}.k.org{color:#f29d12}
.k.edge{color:#2e9a48}.k.thr{color:#d23a2f}
"""
