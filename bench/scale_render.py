"""The scale section of bench/RESULTS.md, from `bench/scale_bench.py`'s JSON (issue 18).

Ratios only (absolute times and peaks are in the JSON): every tool against the floor on the
same model, graphfix against the peers, graphfix check against polygraphy, and the
synthetic model's slope in blocks. The targets are the issue's, judged on the medians;
`section` is rewritten between BEGIN and END, the rest of the file is kept.
"""

from __future__ import annotations

import statistics
from pathlib import Path

BEGIN = "<!-- scale:begin -->"
END = "<!-- scale:end -->"
BIG_MB = 50
"""Targets 1-2 apply to models whose file is over this many MiB."""
NOCHECK_TIME, NOCHECK_MEM, CHECK_TIME = 1.5, 1.3, 2.5
"""graphfix run --no-check against the floor (time, peak RSS); graphfix run with its check."""
POLY_SINGLE, POLY_SAVE_LOAD = 1.5, 0.5
"""graphfix check against one polygraphy mark-all run, and against save-then-compare."""
POLY_TARGET_MB = 300
"""The check-vs-polygraphy target is judged on models at least this large (issue: 350 MB)."""
LINEAR_TOLERANCE = 1.25
"""A larger block count is 'on the line' through the two smallest when its measured time
(peak) is at most this times the line's value (superlinear growth exceeds it)."""
FLOOR_TOOLS = (("graphfix-nocheck", "gf --no-check"), ("graphfix", "gf (check)"),
               ("onnxslim", "onnxslim"), ("onnxsim", "onnxsim"),
               ("onnxsim-check", "onnxsim check_n=1"))
SLOPE_TOOLS = ("floor", "graphfix-nocheck", "graphfix", "onnxslim", "onnxsim", "onnxsim-check",
               "graphfix-check", "polygraphy", "polygraphy-save+load")


def _get(row: dict, tool: str, key: str) -> float | None:
    return row["summary"].get(tool, {}).get(key)


def _ratio(row: dict, tool: str, base: str, key: str) -> float | None:
    a, b = _get(row, tool, key), _get(row, base, key)
    return a / b if a is not None and b else None


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _cell(row: dict, tool: str, base: str = "floor") -> str:
    """'time× / peak×' against `base`, or why there is none."""
    if _get(row, tool, "e2e_s") is None:
        return "FAIL"
    if _get(row, base, "e2e_s") is None:
        return f"({base} failed)"
    return f"{_x(_ratio(row, tool, base, 'e2e_s'))} / {_x(_ratio(row, tool, base, 'peak_mib'))}"


def _verdict(value: float | None, limit: float, misses: list[str], what: str) -> str:
    if value is None:
        misses.append(f"{what}: not measured")
        return "n/a"
    if value <= limit:
        return f"ok ({value:.2f}×)"
    misses.append(f"{what} ({value:.2f}×)")
    return f"MISS ({value:.2f}×)"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def floor_table(models: dict) -> str:
    rows = []
    for name, row in models.items():
        rows.append([name, row["group"], f"{row['file_mb']:.1f}", str(row.get("nodes") or "?"),
                     *(_cell(row, tool) for tool, _ in FLOOR_TOOLS)])
    return _table(["model", "group", "MiB", "nodes", *(h for _, h in FLOOR_TOOLS)], rows)


def _fastest_peer(row: dict) -> str | None:
    peers = [t for t in ("onnxslim", "onnxsim") if _get(row, t, "e2e_s") is not None]
    return min(peers, key=lambda t: _get(row, t, "e2e_s")) if peers else None


def targets_table(models: dict) -> tuple[str, list[str]]:
    rows, misses = [], []
    for name, row in models.items():
        big, zoo = row["file_mb"] > BIG_MB, row["group"] == "zoo"
        if not (big or zoo):
            continue
        cells = [name, f"{row['file_mb']:.0f}"]
        if big:
            cells += [
                _verdict(_ratio(row, "graphfix-nocheck", "floor", "e2e_s"), NOCHECK_TIME, misses,
                         f"{name}: --no-check time ×floor"),
                _verdict(_ratio(row, "graphfix-nocheck", "floor", "peak_mib"), NOCHECK_MEM,
                         misses, f"{name}: --no-check peak ×floor"),
                _verdict(_ratio(row, "graphfix", "floor", "e2e_s"), CHECK_TIME, misses,
                         f"{name}: check time ×floor"),
                _verdict(_ratio(row, "graphfix", "onnxsim", "e2e_s"), 1.0, misses,
                         f"{name}: check time ×onnxsim"),
            ]
        else:
            cells += ["n/a"] * 4
        peer = _fastest_peer(row) if zoo else None
        for tool in ("graphfix-nocheck", "graphfix"):
            if not zoo:
                cells.append("n/a")
            elif peer is None:
                misses.append(f"{name}: no peer finished")
                cells.append("n/a (peers failed)")
            else:
                label = f"{name}: {tool} time ×{peer}"
                cells.append(_verdict(_ratio(row, tool, peer, "e2e_s"), 1.0, misses, label)
                             + f" vs {peer}")
        rows.append(cells)
    header = ["model", "MiB", f"--no-check time ≤{NOCHECK_TIME}× floor",
              f"--no-check peak ≤{NOCHECK_MEM}× floor", f"check time ≤{CHECK_TIME}× floor",
              "check faster than onnxsim (no check)", "--no-check faster than fastest peer",
              "check faster than fastest peer"]
    return (_table(header, rows) if rows else "(no model over "
            f"{BIG_MB} MiB and no zoo model measured)"), misses


def _line(points: list[tuple[int, float]]) -> dict:
    """Line through the two smallest block counts; least squares over all; each larger
    point's measured / predicted."""
    (x0, y0), (x1, y1) = points[0], points[1]
    b = (y1 - y0) / (x1 - x0)
    a = y0 - b * x0
    fit = statistics.linear_regression([p[0] for p in points], [p[1] for p in points]) \
        if len(points) > 2 else None
    beyond = [(x, y / (a + b * x) if a + b * x > 0 else None) for x, y in points[2:]]
    return {"a": a, "b": b, "b_fit": fit.slope if fit else None, "beyond": beyond}


def slope_table(models: dict) -> tuple[str, list[str]]:
    synth = sorted((r for r in models.values() if r["group"] == "synthetic"),
                   key=lambda r: r["blocks"])
    if len(synth) < 2:
        return "(needs the synthetic model at two block counts or more)", []
    counts = [r["blocks"] for r in synth]
    rows, misses = [], []
    for tool in SLOPE_TOOLS:
        cells = [tool]
        for key, unit, scale in (("e2e_s", "ms", 1000.0), ("peak_mib", "MiB", 1.0)):
            points = [(r["blocks"], _get(r, tool, key)) for r in synth]
            points = [(x, y) for x, y in points if y is not None]
            if len(points) < 2:
                cells += ["failed", "—", "—"]
                continue
            fit = _line(points)
            a = f"{fit['a']:.2f} s" if key == "e2e_s" else f"{fit['a']:.0f} MiB"
            sign = "+" if fit["b"] >= 0 else "−"
            cells.append(f"{a} {sign} {abs(fit['b']) * scale:.3g} {unit}/block")
            cells.append("—" if fit["b_fit"] is None
                         else f"{fit['b_fit'] * scale:.3g} {unit}/block")
            marks = []
            for x, q in fit["beyond"]:
                if q is None:
                    marks.append(f"{x}: n/a")
                    continue
                ok = q <= LINEAR_TOLERANCE
                marks.append(f"{x}: {q:.2f}× line {'ok' if ok else 'SUPERLINEAR'}")
                if not ok and tool.startswith("graphfix"):
                    misses.append(f"{tool} {key} at {x} blocks ({q:.2f}× the line)")
            cells.append("; ".join(marks) or "— (2 points)")
        rows.append(cells)
    header = ["tool", "time = a + b·blocks", "b, least squares", "larger counts vs line",
              "peak = a + b·blocks", "b, least squares", "larger counts vs line"]
    note = (f"Block counts {', '.join(map(str, counts))}; the line goes through "
            f"{counts[0]} and {counts[1]}; a larger count is on it when measured ≤ "
            f"{LINEAR_TOLERANCE}× the line's value.")
    return note + "\n\n" + _table(header, rows), misses


def check_table(models: dict) -> tuple[str, list[str]]:
    rows, misses = [], []
    for name, row in models.items():
        big = row["file_mb"] >= POLY_TARGET_MB
        one = _cell(row, "graphfix-check", "polygraphy")
        two = _cell(row, "graphfix-check", "polygraphy-save+load")
        verdicts = (f"{_get(row, 'graphfix-check', 'verdict') or '—'} / "
                    f"{_get(row, 'polygraphy-save+load', 'verdict') or '—'}")
        cells = [name, f"{row['file_mb']:.1f}", one, two, verdicts]
        if big:
            cells += [
                _verdict(_ratio(row, "graphfix-check", "polygraphy", "e2e_s"), POLY_SINGLE,
                         misses, f"{name}: check time ×polygraphy"),
                _verdict(_ratio(row, "graphfix-check", "polygraphy-save+load", "e2e_s"),
                         POLY_SAVE_LOAD, misses, f"{name}: check time ×polygraphy save+load")]
        else:
            cells += ["n/a", "n/a"]
        rows.append(cells)
    header = ["model", "MiB", "check ×polygraphy mark-all (time / peak)",
              "check ×polygraphy save+load (time / peak)", "verdict graphfix / polygraphy",
              f"≤{POLY_SINGLE}× one run (≥{POLY_TARGET_MB} MiB)",
              f"≤{POLY_SAVE_LOAD}× save+load (≥{POLY_TARGET_MB} MiB)"]
    return _table(header, rows), misses


def failures(models: dict) -> list[str]:
    found = []
    for name, row in models.items():
        for tool, summary in row["summary"].items():
            for error in summary.get("errors", []):
                bad = summary["runs"] - summary["ok_runs"]
                found.append(f"{name} / {tool}: {bad} of {summary['runs']} run(s): {error}")
            if summary.get("rolled_back"):
                found.append(f"{name} / {tool}: a pass was rolled back (see the JSON's stdout)")
    return found


def _header(data: dict) -> list[str]:
    meta, m = data["meta"], data["meta"]["machine"]
    shapes = "; ".join(f"{n}: " + ", ".join(f"{k} {'x'.join(map(str, v))}"
                                             for k, v in row["shapes"].items())
                       for n, row in data["models"].items() if row["shapes"]) or "none"
    syn = meta["synthetic"]
    lines = [
        "## Scale (issue 18): time and memory against the floor, the peers and polygraphy", "",
        f"Generated by `bench/scale_bench.py` on {meta['when']} "
        f"(took {meta.get('seconds', 0):.0f} s); raw data (absolute times, peaks, every run) "
        "in its `--json`.", "",
        f"- Command: `{meta['command']}`",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['ram']} RAM; load average at start "
        f"{meta['loadavg_start'][0]:.2f}, at end {meta.get('loadavg_end', [0.0])[0]:.2f}",
        f"- Python {m['python']}; {m['packages']}",
        f"- graphfix {meta['graphfix']}, default pipeline `{meta['pipeline']}`",
        f"- Runs: {meta['runs']} per (tool, model), each a fresh process, interleaved; medians. "
        f"Timeout {meta['timeout_s']:.0f} s per process. Seed {meta['seed']}.",
        f"- Input shapes, the same for every tool (graphfix `--input-shape`, onnxsim "
        f"`test_input_shapes`, polygraphy `--input-shapes`): {shapes}; static inputs: none given.",
        f"- Synthetic model: N residual blocks Conv-BN-ReLU-Conv-BN-Add-ReLU, "
        f"{syn['channels']} channels, {syn['side']}x{syn['side']}, static, inline weights.",
        "", "Tools:", "", *(f"- `{t}`: {n}" for t, n in meta["tool_notes"].items())]
    return lines


def section(data: dict) -> str:
    models = data["models"]
    targets, t_miss = targets_table(models)
    slopes, s_miss = slope_table(models)
    checks, c_miss = check_table(models)
    misses = t_miss + s_miss + c_miss
    parts = [BEGIN, *_header(data), "",
             "### Ratios to the floor (time / peak RSS of the whole process)", "",
             floor_table(models), "",
             f"### Targets (models over {BIG_MB} MiB; fastest peer on zoo models)", "",
             targets, "",
             "### Synthetic model: time and peak against block count", "", slopes, "",
             "### graphfix check against polygraphy (ratios: time / peak RSS)", "",
             "polygraphy save+load = the save run on MODEL plus the load-and-compare run on "
             "REWRITTEN (time summed, peak the larger). Verdicts: graphfix check "
             "`agree`/`differ`; polygraphy's comparison `PASSED`/`FAILED`.", "",
             checks, "",
             "Missed: " + "; ".join(misses) + "." if misses else "All targets met.", "",
             "### Failures, timeouts and rollbacks", ""]
    parts += [f"- {f}" for f in failures(models)] or ["none"]
    return "\n".join([*parts, END])


def write_section(path: Path, text: str) -> None:
    """Replace the section between the markers, or append it; the rest stays as it is."""
    old = path.read_text() if path.exists() else ""
    if BEGIN in old and END in old:
        old = old[:old.index(BEGIN)] + text + old[old.index(END) + len(END):]
    else:
        old = old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(old)
