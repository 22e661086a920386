"""`calibrate_html`: a `graphfix calibrate` result as one self-contained HTML page.

    header     the model, the method the written model uses, how many tensors it clips
    methods    one row per method (`MethodOutcome.summary()`), the used one highlighted
    warnings   the used method's bad clips (`clipping.Clip.message()`), then the others'
    histograms one per quantized tensor (the used outcome's `amaxes`): counts of |x|
               summed to about `BARS` bars on a log count axis, a vertical line per
               method at its amax (the used one bold and labelled), the observed amax
               dotted; the tensors the used method clips come first, framed in red,
               with the clipped range shaded
    data       `result.ranges_json()` in the page's JSON block (`_page.data_block`)

A tensor costs about 3 kB (its bars are one path; the JSON adds about 0.4 kB), so 300
tensors make a page of about 1 MB; past `MAX_PLOTS` the rest are a table.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from graphfix.htmlreport._page import Markup, code, document, esc, fmt, notes_list, table
from graphfix.htmlreport._svg import Canvas, Scale, decade_ticks, nice_ticks, num

if TYPE_CHECKING:
    from graphfix.calibration.clipping import Clip
    from graphfix.calibration.runner import CalibrationResult, MethodOutcome
    from graphfix.calibration.stats import TensorStats

BARS = 100
MAX_PLOTS = 400
MAX_ROWS = 200
PALETTE = ("#1f5fbf", "#d6336c", "#2b9348", "#7b3fbf", "#e07b00", "#0f8b9a", "#8c564b",
           "#5c6370")
W, H = 520, 168
LEFT, RIGHT, TOP, BOTTOM = 50, 512, 16, 132
SEP = " \u00b7 "


def calibrate_html(result: CalibrationResult, *, model: str) -> str:
    """The page for `result`, calibrated from `model` (a name or path, as the user gave it)."""
    used = result.outcome()
    colors = {o.method: i % len(PALETTE) for i, o in enumerate(result.outcomes)}
    first = [c.tensor for c in used.clips if c.tensor in used.amaxes]
    names = list(dict.fromkeys([*first, *used.amaxes]))
    title = f"graphfix calibrate: {model} \u2014 {used.method}"
    body = [
        _header(result, model, used, names),
        _methods(result, colors),
        _warnings(result, used),
        notes_list(result.notes),
        _histograms(result, used, names, colors),
    ]
    return document(title, body, result.ranges_json(), _style())


def _header(result: CalibrationResult, model: str, used: MethodOutcome,
            names: list[str]) -> Markup:
    n = len(used.clips)
    badge = (f'<span class="verdict fail">{n} tensor{"s" * (n != 1)} clipped</span>' if n
             else '<span class="verdict pass">no bad clips</span>')
    meta = (f"{len(names)} quantized tensor{'s' * (len(names) != 1)} \u00b7 methods: "
            f"{', '.join(o.method for o in result.outcomes)} \u00b7 statistics in "
            f"{result.stats_seconds:.2f} s")
    return Markup(f"<header><h1>graphfix calibrate: {code(model)} \u2014 written with "
                  f"<b>{esc(used.method)}</b> {badge}</h1><p class=\"meta\">{esc(meta)}</p>"
                  "</header>")


_HEADS = {"sqnr_db": "output SQNR dB", "top1_agreement": "top-1 agreement"}


def _cell(value: object) -> object:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "\u2014"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "\u2014"
    if isinstance(value, float):
        return fmt(value)
    return "\u2014" if value is None else value


def _methods(result: CalibrationResult, colors: dict[str, int]) -> Markup:
    summaries = [o.summary() for o in result.outcomes]
    keys = list(dict.fromkeys(k for s in summaries for k in s if k != "method"))
    rows, classes = [], []
    for o, s in zip(result.outcomes, summaries, strict=True):
        used = o.method == result.recommended
        name = Markup(f'<span class="sw c{colors[o.method]}"></span>{esc(o.method)}')
        rows.append([name, "\u2713 written" if used else "", *(_cell(s.get(k)) for k in keys)])
        classes.append("used" if used else ("bad" if o.clips else ""))
    head = ["method", "used", *(_HEADS.get(k, k.replace("_", " ")) for k in keys)]
    return Markup(f"<section><h2>Methods</h2>{table(head, rows, row_classes=classes)}"
                  "</section>")


def _warnings(result: CalibrationResult, used: MethodOutcome) -> Markup:
    from graphfix.calibration.clipping import LOSS_DB

    if used.clips:
        items = "".join(f'<div class="warn">{esc(c.message())}</div>' for c in used.clips)
    else:
        items = (f'<p class="ok-box">No bad clip: with {esc(used.method)} no tensor loses '
                 f"more than {LOSS_DB:g} dB (one bit) against another method's range.</p>")
    others = [c for o in result.outcomes if o is not used for c in o.clips]
    extra = ""
    if others:
        rows = [(c.method, code(c.tensor, 80), fmt(c.amax), fmt(c.observed),
                 fmt(c.lost_db, 3), c.best_method) for c in others[:MAX_ROWS]]
        head = ("method", "tensor", "amax", "observed amax", "dB lost", "best method")
        extra = (f"<details><summary>Bad clips under the other methods ({len(others)})"
                 f"</summary>{table(head, rows)}</details>")
    return Markup(f"<section><h2>Clipping warnings</h2>{items}{extra}</section>")


def _legend(result: CalibrationResult, colors: dict[str, int]) -> Markup:
    spans = []
    for o in result.outcomes:
        used = o.method == result.recommended
        label = f"{o.method} (used)" if used else o.method
        spans.append(f'<span><span class="ln c{colors[o.method]}{" used" * used}"></span>'
                     f"{esc(label)}</span>")
    spans.append('<span><span class="ln obs"></span>observed amax</span>')
    spans.append('<span><span class="sw cliparea"></span>range the used method clips '
                 "(flagged tensors)</span>")
    return Markup(f'<div class="legend">{"".join(spans)}</div>')


def _histograms(result: CalibrationResult, used: MethodOutcome, names: list[str],
                colors: dict[str, int]) -> Markup:
    clips = {c.tensor: c for c in used.clips}
    cards = [_card(name, result, used, clips.get(name), colors) for name in names[:MAX_PLOTS]]
    rest = ""
    if len(names) > MAX_PLOTS:
        rows = [(code(n, 80), fmt(getattr(result.stats.get(n), "amax", None)),
                 fmt(used.amaxes[n])) for n in names[MAX_PLOTS:]]
        rest = (f'<p class="muted">{len(names) - MAX_PLOTS} more tensors, without a '
                f"histogram:</p>{table(('tensor', 'observed amax', 'amax'), rows)}")
    return Markup("<section><h2>Ranges per quantized tensor</h2>"
                  f"{_legend(result, colors)}<div class=\"cards\">{''.join(cards)}</div>"
                  f"{rest}</section>")


def _card(name: str, result: CalibrationResult, used: MethodOutcome, clip: Clip | None,
          colors: dict[str, int]) -> str:
    s = result.stats.get(name)
    flag, why = "", ""
    if clip is not None:
        flag = f'<span class="badge">CLIPPED \u2212{clip.lost_db:.1f} dB</span> '
        why = (f'<p class="clipmsg">{esc(clip.method)} keeps {fmt(clip.amax)} of the observed '
               f"{fmt(clip.observed)}: simulated SQNR {clip.sqnr_db:.1f} dB, "
               f"{esc(clip.best_method)} would give {clip.best_sqnr_db:.1f} dB</p>")
    plot = _plot(s, result, used, clip, colors) if s is not None else \
        Markup('<p class="muted">no statistics were collected for this tensor</p>')
    values = [f'<span class="c{colors[o.method]}">{esc(o.method)} {fmt(o.amaxes.get(name))}'
              + (f" ({esc(o.chosen_by_tensor[name])})" if name in o.chosen_by_tensor else "")
              + "</span>" for o in result.outcomes]
    if s is not None:
        values.insert(0, f"observed {fmt(s.amax)} (min {fmt(s.min)}, max {fmt(s.max)})")
    return (f'<div class="card{" clipped" * (clip is not None)}"><h3>{flag}{code(name, 70)}</h3>'
            f'{why}{plot}<p class="amx">{SEP.join(values)}</p></div>')


def _bars(hist: np.ndarray, amax: float) -> tuple[np.ndarray, np.ndarray]:
    """`hist` summed into at most BARS bars: (counts, edges in |x|)."""
    hist = np.asarray(hist, dtype=np.int64)
    cuts = np.unique(np.linspace(0, hist.size, min(BARS, hist.size) + 1).round().astype(int))
    counts = np.add.reduceat(hist, cuts[:-1])
    return counts, cuts * (float(amax) / hist.size)


def _outline(counts: np.ndarray, edges: np.ndarray, x: Scale, y: Scale) -> str:
    """The bars as one closed step path (neighbours of equal height share a step)."""
    runs: list[list[str]] = []  # [height, right edge] per step
    for count, right in zip(counts, edges[1:], strict=True):
        level = num(y(count) if count > 0 else BOTTOM)
        if runs and runs[-1][0] == level:
            runs[-1][1] = num(x(right))
        else:
            runs.append([level, num(x(right))])
    steps = "".join(f"V{level}H{right}" for level, right in runs)
    return f"M{num(x(0))} {num(BOTTOM)}{steps}V{num(BOTTOM)}Z"


def _plot(s: TensorStats, result: CalibrationResult, used: MethodOutcome, clip: Clip | None,
          colors: dict[str, int]) -> Markup:
    lines = [(o, o.amaxes.get(s.name)) for o in result.outcomes]
    lines = [(o, float(a)) for o, a in lines if a is not None and math.isfinite(a)]
    xmax = max([float(s.amax), *(a for _, a in lines)])
    if xmax <= 0 or s.hist.size == 0 or int(s.hist.sum()) == 0:
        return Markup('<p class="muted">every value is 0: nothing to plot</p>')
    counts, edges = _bars(s.hist, s.amax)
    c = Canvas(W, H, f"histogram of |{s.name}| with each method's amax", "hist")
    x = Scale(0.0, xmax * 1.03, LEFT, RIGHT)
    y = Scale(0.5, max(float(counts.max()) * 1.6, 10.0), BOTTOM, TOP, log=True)
    c.y_axis(y, decade_ticks(1.0, y.hi, 5), LEFT, RIGHT, "count")
    c.x_axis(x, nice_ticks(0.0, xmax, 6), BOTTOM, "|x|")
    if clip is not None:
        c.rect(x(clip.amax), TOP, x(clip.observed) - x(clip.amax), BOTTOM - TOP, "cliparea",
               f"clipped by {clip.method}: |x| above {fmt(clip.amax)} saturates")
    c.path(_outline(counts, edges, x, y), "bars")
    c.line(x(s.amax), TOP, x(s.amax), BOTTOM, "obs", f"observed amax {fmt(s.amax)}")
    for o, a in sorted(lines, key=lambda p: p[0] is used):
        chosen = f" (chose {o.chosen_by_tensor[s.name]})" if s.name in o.chosen_by_tensor else ""
        tip = f"{o.method}: amax {fmt(a)}{chosen}" + (", used" if o is used else "")
        c.line(x(a), TOP, x(a), BOTTOM, f"m m{colors[o.method]}{' used' * (o is used)}", tip)
    ux = x(used.amaxes.get(s.name, 0.0))
    right = ux > (LEFT + RIGHT) / 2
    c.text(ux + (-4 if right else 4), TOP + 10, used.method, f"ulab c{colors[used.method]}",
           "end" if right else "start")
    return c.render()


def _style() -> str:
    colors = "".join(f".c{i}{{color:{v};fill:{v}}}svg .m{i}{{stroke:{v}}}"
                     f".sw.c{i}{{background:{v}}}" for i, v in enumerate(PALETTE))
    return colors + """
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(480px,1fr));gap:12px}
.card{border:1px solid #dde1e8;border-radius:5px;padding:8px 10px;min-width:0}
.card.clipped{border:2px solid #c62828;background:#fffafa}
.clipmsg{color:#b3261e;margin:0 0 4px;font-size:12.5px}
.amx{margin:2px 0 0;font-size:12px;color:#4a5262}
svg.hist .bars{fill:#c9d2e3;stroke:#8391ad;stroke-width:.6}
svg.hist .m{stroke-width:1.4;stroke-dasharray:4 3}
svg.hist .m.used{stroke-width:3;stroke-dasharray:none}
svg.hist .obs{stroke:#111;stroke-width:1.3;stroke-dasharray:1.5 2.5}
svg.hist .cliparea{fill:#e53935;fill-opacity:.13}
svg.hist .ulab{font-weight:700}
.sw{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;
vertical-align:-1px}.sw.cliparea{background:#f8d0ce}
.ln{display:inline-block;width:22px;height:0;border-top:2px dashed;margin-right:5px;
vertical-align:3px}
.ln.used{border-top:4px solid}.ln.obs{border-top:2px dotted #111}
"""
