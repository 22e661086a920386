"""The page skeleton shared by the HTML reports: escaping, numbers, tables, the document.

Every string that may come from a model (tensor, node and model names, notes that quote
them) goes through `esc`: control and bidi-formatting characters are spelled out as
`graphfix.text.printable` does (`\\x1b`, `\\u202e`), then `html.escape` makes it inert
in text and in attribute values. Markup built here is wrapped in `Markup`, which `esc`
passes through unchanged, so a cell is escaped exactly once.

The result's JSON goes in `<script type="application/json" id="graphfix-data">`: data,
never run. `<`, `>` and `&` are written as JSON escapes (`\\u003c`), so no name can close
the block or open a comment in it, and `JSON.parse` or `json.loads` still read the exact
names back. Non-finite numbers become the strings "inf", "-inf", "nan" (the convention of
the check report's own JSON).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from graphfix.text import printable

DATA_ID = "graphfix-data"


class Markup(str):
    """Text that is already HTML (built by these modules from escaped parts)."""


def esc(value: object) -> Markup:
    """`value` as HTML text: a `Markup` as it is, anything else printable and escaped."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(printable(str(value)), quote=True))


def clip_text(text: str, limit: int = 60) -> str:
    """`text` cut to `limit` characters with an ellipsis (for labels; tooltips keep it all)."""
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def fmt(value: float | int | None, digits: int = 4) -> str:
    """A number for a table: "—" for None, "∞"/"-∞"/"nan" for non-finite, else `digits`
    significant digits."""
    if value is None:
        return "\u2014"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "\u221e" if value > 0 else "-\u221e"
    return f"{value:.{digits}g}"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *,
          row_classes: Sequence[str] | None = None, cls: str = "") -> Markup:
    """An HTML table; every cell is escaped unless it is `Markup`."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        klass = row_classes[i] if row_classes and row_classes[i] else ""
        attr = f' class="{klass}"' if klass else ""
        body.append(f"<tr{attr}>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
    attr = f' class="{cls}"' if cls else ""
    return Markup(f"<table{attr}><thead><tr>{head}</tr></thead><tbody>"
                  + "".join(body) + "</tbody></table>")


def code(text: str, limit: int | None = None) -> Markup:
    """A name in `<code>`, escaped; cut to `limit` characters with the full name as a
    tooltip."""
    shown = clip_text(text, limit) if limit else text
    title = f' title="{esc(text)}"' if shown != text else ""
    return Markup(f"<code{title}>{esc(shown)}</code>")


def notes_list(notes: Sequence[str]) -> Markup:
    if not notes:
        return Markup("")
    items = "".join(f"<li>{esc(n)}</li>" for n in notes)
    return Markup(f"<section><h2>Notes</h2><ul class=\"notes\">{items}</ul></section>")


def _finite(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def data_block(data: dict) -> Markup:
    """The JSON data block (module docstring): ASCII, `<`/`>`/`&` as \\u escapes."""
    text = json.dumps(_finite(data), ensure_ascii=True, allow_nan=False,
                      separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Markup(f'<script type="application/json" id="{DATA_ID}">{text}</script>')


STYLE = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
margin:0;padding:20px 28px;color:#1d2330;background:#fff}
h1{font-size:21px;margin:0 0 6px}h2{font-size:17px;margin:26px 0 8px;
border-bottom:1px solid #dde1e8;padding-bottom:3px}h3{font-size:14px;margin:0 0 4px}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#f2f4f7;
padding:0 3px;border-radius:3px;overflow-wrap:anywhere}
.verdict{padding:1px 8px;border-radius:4px;color:#fff;font-size:16px}
.pass{background:#2e7d32}.fail{background:#c62828}
.meta{color:#4a5262;margin:2px 0}.muted{color:#6b7384}
table{border-collapse:collapse;margin:4px 0 8px;font-size:13px}
th,td{border:1px solid #dde1e8;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f5f6f8}td{font-variant-numeric:tabular-nums}
tr.first td{background:#fff1d6}tr.bad td:first-child{border-left:3px solid #c62828}
tr.used td{font-weight:600;background:#eef4ff}
.warn{background:#fff4f2;border:1px solid #e5a49a;border-left:5px solid #c62828;
padding:6px 12px;margin:8px 0;border-radius:3px}
.ok-box{background:#f1f8f1;border:1px solid #a8d0aa;border-left:5px solid #2e7d32;
padding:6px 12px;margin:8px 0;border-radius:3px}
.badge{display:inline-block;font-size:11px;font-weight:700;padding:0 6px;border-radius:3px;
color:#fff;background:#c62828;vertical-align:1px}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;margin:4px 0 8px;font-size:13px}
.legend span{white-space:nowrap}
ul.notes li{margin:2px 0}
details{margin:6px 0}summary{cursor:pointer;color:#2a4b8d}
svg{display:block;width:100%;height:auto}
svg text{font:11px system-ui,sans-serif;fill:#39404d}
svg .grid{stroke:#e8ebf0;stroke-width:1}svg .axis{stroke:#8a93a3;stroke-width:1}
svg .lab{fill:#5a6272}svg .big{font-size:13px}
"""


def document(title: str, body: Sequence[str], data: dict, style: str = "") -> str:
    """One complete, self-contained HTML document: inline style, no script that runs,
    no external reference; `data` in the JSON block."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        '<meta name="generator" content="graphfix">',
        f"<title>{esc(title)}</title>",
        f"<style>{STYLE}{style}</style>",
        "</head><body>",
        *body,
        data_block(data),
        "</body></html>",
        "",
    ]
    return "\n".join(parts)
