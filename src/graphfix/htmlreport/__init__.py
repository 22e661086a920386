"""Self-contained HTML reports: one page per result, nothing fetched, nothing run.

    check_html(report, reference=..., candidate=...)   # graphfix check (LayerwiseReport)
    calibrate_html(result, model=...)                  # graphfix calibrate (CalibrationResult)

Each returns one `<!DOCTYPE html>` document: inline style, inline SVG plots with tooltips,
tables, and the result's JSON in a `<script type="application/json">` block (data, never
run). Every name from a model is escaped (`_page.esc`). The library only returns the
text; the CLI writes the file.
"""

from graphfix.htmlreport.calibrate import calibrate_html
from graphfix.htmlreport.check import check_html

__all__ = ["calibrate_html", "check_html"]
