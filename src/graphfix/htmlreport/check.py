"""`check_html`: a `graphfix check` layer-wise report as one self-contained HTML page.

    title      the two models and the verdict (passed / FAILED)
    plot       error per compared tensor in topological order (`_checkplot`): the first
               divergence marked, the origins numbered
    tables     first divergence; origins; the diverging tensors (strict) or the quantized
               layers by SQNR (sqnr); notes; every tensor (folded)
    data       `report.to_json()` in the page's JSON block (`_page.data_block`)

Long tables are cut (`MAX_ROWS`, `MAX_ALL_ROWS`) with a line saying how many rows the
embedded JSON holds, so a model of thousands of tensors stays a page a browser opens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphfix.htmlreport import _checkplot
from graphfix.htmlreport._page import Markup, code, document, esc, fmt, notes_list, table

if TYPE_CHECKING:
    from graphfix.check.layerwise import LayerwiseReport, TensorResult

MAX_ROWS = 200  # diverging / sensitivity rows
MAX_ALL_ROWS = 1000  # rows of the folded table of every tensor
NAME_CHARS = 90  # longer names are cut in tables (the tooltip has all of it)


def check_html(report: LayerwiseReport, *, reference: str, candidate: str) -> str:
    """The page for `report`, which compared `candidate` with `reference` (model names or
    paths, as the user gave them)."""
    verdict = "passed" if report.passed else "FAILED"
    title = f"graphfix check: {reference} vs {candidate} \u2014 {verdict}"
    svg, bucket = _checkplot.plot(report)
    data = report.to_json()
    body = [
        _header(report, reference, candidate),
        _plot_section(report, svg, bucket),
        _first_divergence(report),
        _origins(report),
        _rows(report, data.get("exclude_nodes") or []),
        notes_list(report.notes),
        _all_tensors(report),
    ]
    return document(title, body, data, _checkplot.STYLE)


def _header(report: LayerwiseReport, reference: str, candidate: str) -> Markup:
    compared = [t for t in report.tensors if t.ok is not None]
    failing = sum(t.ok is False for t in compared)
    badge = ('<span class="verdict pass">passed</span>' if report.passed
             else '<span class="verdict fail">FAILED</span>')
    if report.mode == "sqnr":
        rule = f"sqnr: ok at SQNR \u2265 {fmt(report.sqnr_threshold)} dB; the verdict is " \
               "the graph outputs'"
        bad = "below the threshold"
    else:
        rule = "strict: each tensor within its dtype's tolerance"
        bad = "out of tolerance"
    meta = (f"mode {rule} \u00b7 candidate ran in {report.runtime} \u00b7 "
            f"{report.samples} sample{'s' * (report.samples != 1)} \u00b7 "
            f"{len(compared)} of {len(report.tensors)} tensors compared, {failing} {bad}")
    return Markup(f"<header><h1>graphfix check: {code(reference)} vs {code(candidate)} "
                  f"\u2014 {badge}</h1><p class=\"meta\">{esc(meta)}</p></header>")


def _legend(report: LayerwiseReport, bucket: int) -> Markup:
    if report.mode == "sqnr":
        items = [("ok", "\u25cf", "SQNR \u2265 threshold"), ("bad", "\u25cf", "below threshold"),
                 ("edge", "\u25b2", "exact (SQNR \u221e)"), ("bad", "\u25bc", "nan / -\u221e"),
                 ("thr", "- -", "threshold")]
    else:
        items = [("ok", "\u25cf", "within tolerance"), ("bad", "\u25cf", "out of tolerance"),
                 ("edge", "\u25bc", "exact (error 0)"), ("bad", "\u25b2", "inf / nan error")]
    items += [("org", "\u25c6", "origin (node that amplifies the error; number = rank)"),
              ("", "\u2506", "first divergence")]
    spans = "".join(f'<span><span class="k {cls}">{sym}</span> {esc(text)}</span>'
                    for cls, sym, text in items)
    note = ""
    if bucket > 1:
        note = (f'<p class="muted">The line joins every compared tensor; marks show the worst '
                f"tensor of every {bucket} in a row, the first divergence and the origins "
                "(hover a mark for its name and value).</p>")
    return Markup(f'<div class="legend">{spans}</div>{note}')


def _plot_section(report: LayerwiseReport, svg: Markup, bucket: int) -> Markup:
    what = "SQNR per tensor" if report.mode == "sqnr" else "Error per tensor"
    if not svg:
        return Markup(f'<section><h2>{what}</h2><p class="muted">No tensor was compared, '
                      "so there is nothing to plot.</p></section>")
    return Markup(f"<section><h2>{what}</h2>{svg}{_legend(report, bucket)}</section>")


def _first_divergence(report: LayerwiseReport) -> Markup:
    first = report.first_divergence
    if first is None:
        text = ("No tensor is below the SQNR threshold." if report.mode == "sqnr"
                else "No tensor diverges: every compared tensor is within tolerance.")
        cls = "ok-box"
        if not any(t.ok is not None for t in report.tensors):
            text, cls = "No tensor was compared, so none diverges.", "muted"
        return Markup(f'<p class="{cls}" id="first-divergence">{text}</p>')
    numbers = (f"max abs {fmt(first.max_abs)}, max rel {fmt(first.max_rel)}, "
               f"SQNR {fmt(first.sqnr_db)} dB, worst on sample {fmt(first.worst_sample)}")
    return Markup(f'<p class="warn" id="first-divergence"><b>First divergence</b> '
                  f"(tensor #{first.order}): {code(first.name)} from {esc(first.node)}: "
                  f"{esc(numbers)}</p>")


def _origins(report: LayerwiseReport) -> Markup:
    if not report.origins:
        return Markup("")
    rows = [(i + 1, code(o.node, NAME_CHARS), code(o.name, NAME_CHARS), o.op, fmt(o.error),
             fmt(o.input_error), o.describe_amplification(), o.sample)
            for i, o in enumerate(report.origins)]
    head = ("#", "node", "tensor", "op", "error", "input error", "amplification", "sample")
    return Markup("<section><h2>Origins: where the error starts</h2>"
                  '<p class="muted">Nodes whose output error is much larger than their '
                  "inputs', ranked by that amplification.</p>"
                  f"{table(head, rows, cls='origins')}</section>")


def _row(t: TensorResult) -> list[object]:
    return [t.order, code(t.name, NAME_CHARS), esc(t.node), t.dtype, fmt(t.max_abs),
            fmt(t.max_rel), fmt(t.sqnr_db), fmt(t.worst_sample),
            {True: "ok", False: "FAIL", None: "\u2014"}[t.ok]]


_HEAD = ("#", "tensor", "node", "dtype", "max abs", "max rel", "SQNR dB", "worst sample", "ok")


def _classes(rows: list[TensorResult], report: LayerwiseReport) -> list[str]:
    first = report.first_divergence.name if report.first_divergence else None
    return ["first" if t.name == first else ("bad" if t.ok is False else "") for t in rows]


def _more(shown: int, total: int) -> str:
    if total <= shown:
        return ""
    return (f'<p class="muted">{total - shown} more not shown: the JSON data block '
            f'(id "graphfix-data") holds every tensor.</p>')


def _rows(report: LayerwiseReport, exclude: list[str]) -> Markup:
    """The diverging tensors (strict), or the quantized layers by SQNR and the nodes the
    report suggests keeping in float (`exclude`, its JSON's "exclude_nodes")."""
    if report.mode == "sqnr":
        every = report.sensitivity(len(report.tensors))
        shown = every[:MAX_ROWS]
        hint = ""
        if exclude:
            hint = ("<p>To keep the worst layers in float: "
                    f"{code('--exclude-nodes ' + ','.join(exclude))}</p>")
        head = "<h2>Sensitivity: quantized layers, lowest SQNR first</h2>"
    else:
        every = [t for t in report.tensors if t.ok is False]
        shown = every[:MAX_ROWS]
        hint = ""
        head = "<h2>Diverging tensors</h2>"
    if not every:
        return Markup("")
    body = table(_HEAD, [_row(t) for t in shown], row_classes=_classes(shown, report))
    return Markup(f"<section>{head}{hint}{body}{_more(len(shown), len(every))}</section>")


def _all_tensors(report: LayerwiseReport) -> Markup:
    if not report.tensors:
        return Markup("")
    shown = report.tensors[:MAX_ALL_ROWS]
    rows = [[*row[:3], t.describe_status(), *row[3:]] for t in shown for row in [_row(t)]]
    head = (*_HEAD[:3], "status", *_HEAD[3:])
    body = table(head, rows, row_classes=_classes(shown, report))
    return Markup(f"<section><details><summary>Every tensor ({len(report.tensors)})"
                  f"</summary>{body}{_more(len(shown), len(report.tensors))}</details>"
                  "</section>")
