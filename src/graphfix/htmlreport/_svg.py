"""Inline SVG plotting for the HTML reports, written as text: scales, ticks, marks.

A `Canvas` collects elements and renders one `<svg>` with a viewBox (it scales with the
page). Styling is by CSS class, defined in the page's `<style>`, so a mark costs a few
bytes; coordinates are written with at most one decimal. Tooltips are SVG `<title>`
children. Every text argument is escaped here (`_page.esc`): callers pass model
strings as they are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from graphfix.htmlreport._page import Markup, esc


def num(value: float) -> str:
    """A coordinate: one decimal, without a trailing ".0"."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True)
class Scale:
    """Maps data [lo, hi] to pixels [start, end] (end < start for a y axis); `log`
    maps log10 of the value (lo, hi > 0)."""

    lo: float
    hi: float
    start: float
    end: float
    log: bool = False

    def __call__(self, value: float) -> float:
        lo, hi, v = self.lo, self.hi, value
        if self.log:
            lo, hi, v = math.log10(lo), math.log10(hi), math.log10(max(v, self.lo))
        span = (hi - lo) or 1.0
        return self.start + (v - lo) / span * (self.end - self.start)


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values (1, 2, 5 x 10^k steps) covering [lo, hi], about `count` of them."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(count - 1, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + step * 1e-9:
        ticks.append(round(k * step, 12))
        k += 1
    return ticks


def decade_ticks(lo: float, hi: float, most: int = 8) -> list[float]:
    """Powers of ten in [lo, hi] (lo, hi > 0), thinned to at most `most`."""
    a, b = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
    exps = list(range(a, b + 1))
    stride = max(1, math.ceil(len(exps) / most))
    return [10.0 ** e for e in exps[::stride]]


def tick_label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        mantissa, exp = f"{value:.0e}".split("e")
        return f"{mantissa}e{int(exp)}"
    return f"{value:.4g}"


@dataclass
class Canvas:
    """An SVG drawing `width` x `height` (viewBox units); `label` is its accessible name."""

    width: int
    height: int
    label: str
    cls: str = ""
    parts: list[str] = field(default_factory=list)

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def line(self, x1: float, y1: float, x2: float, y2: float, cls: str,
             title: str | None = None) -> None:
        head = (f'<line class="{cls}" x1="{num(x1)}" y1="{num(y1)}" x2="{num(x2)}" '
                f'y2="{num(y2)}"')
        self.add(head + (f"><title>{esc(title)}</title></line>" if title else "/>"))

    def text(self, x: float, y: float, text: str, cls: str = "", anchor: str = "start",
             title: str | None = None) -> None:
        klass = f' class="{cls}"' if cls else ""
        tip = f"<title>{esc(title)}</title>" if title else ""
        self.add(f'<text{klass} x="{num(x)}" y="{num(y)}" text-anchor="{anchor}">'
                 f"{tip}{esc(text)}</text>")

    def path(self, d: str, cls: str, title: str | None = None) -> None:
        tip = f"><title>{esc(title)}</title></path>" if title else "/>"
        self.add(f'<path class="{cls}" d="{d}"{tip}')

    def rect(self, x: float, y: float, w: float, h: float, cls: str,
             title: str | None = None) -> None:
        tip = f"><title>{esc(title)}</title></rect>" if title else "/>"
        self.add(f'<rect class="{cls}" x="{num(x)}" y="{num(y)}" width="{num(max(w, 0))}" '
                 f'height="{num(max(h, 0))}"{tip}')

    def marker(self, shape: str, x: float, y: float, cls: str, title: str,
               size: float = 3.5) -> None:
        """A point mark with a tooltip: "circle", "diamond", "up" or "down" (triangles)."""
        s = size
        if shape == "circle":
            head = f'<circle class="{cls}" cx="{num(x)}" cy="{num(y)}" r="{num(s)}">'
            self.add(f"{head}<title>{esc(title)}</title></circle>")
            return
        d = {
            "diamond": f"M{num(x)} {num(y - s * 1.5)}l{num(s * 1.5)} {num(s * 1.5)} "
                       f"{num(-s * 1.5)} {num(s * 1.5)} {num(-s * 1.5)} {num(-s * 1.5)}z",
            "up": f"M{num(x)} {num(y - s)}l{num(s)} {num(2 * s)}h{num(-2 * s)}z",
            "down": f"M{num(x)} {num(y + s)}l{num(s)} {num(-2 * s)}h{num(-2 * s)}z",
        }[shape]
        self.path(d, cls, title)

    def y_axis(self, scale: Scale, ticks: Sequence[float], x0: float, x1: float,
               label: str = "") -> None:
        """Grid lines across [x0, x1] at `ticks`, their labels left of x0."""
        if ticks:
            self.path("".join(f"M{num(x0)} {num(scale(t))}H{num(x1)}" for t in ticks), "grid")
        for t in ticks:
            self.text(x0 - 5, scale(t) + 3.5, tick_label(t), "lab", "end")
        self.line(x0, min(scale.start, scale.end), x0, max(scale.start, scale.end), "axis")
        if label:
            mid = (scale.start + scale.end) / 2
            self.add(f'<text class="lab" transform="translate(12 {num(mid)}) rotate(-90)" '
                     f'text-anchor="middle">{esc(label)}</text>')

    def x_axis(self, scale: Scale, ticks: Sequence[float], y: float, label: str = "") -> None:
        """The axis line at `y`, tick marks and labels below it."""
        self.line(min(scale.start, scale.end), y, max(scale.start, scale.end), y, "axis")
        if ticks:
            self.path("".join(f"M{num(scale(t))} {num(y)}v4" for t in ticks), "axis")
        for t in ticks:
            self.text(scale(t), y + 15, tick_label(t), "lab", "middle")
        if label:
            self.text((scale.start + scale.end) / 2, y + 30, label, "lab", "middle")

    def render(self) -> Markup:
        klass = f' class="{self.cls}"' if self.cls else ""
        return Markup(f'<svg{klass} viewBox="0 0 '
                      f'{self.width} {self.height}" width="{self.width}" '
                      f'height="{self.height}" role="img" aria-label="{esc(self.label)}">'
                      + "".join(self.parts) + "</svg>")
