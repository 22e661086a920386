"""The zoo table (terminal and bench/RESULTS.md) from `zoo_run`'s merged JSON data.

RESULTS.md keeps everything outside the zoo markers; the section between them is
replaced, or appended at the end the first time.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from render import table  # bench/ is sys.path[0]
from zoo_run import SECOND

from graphfix.report import APPLIED, ROLLED_BACK

BEGIN = "<!-- zoo:begin (bench/zoo.py run rewrites this section) -->"
END = "<!-- zoo:end -->"
PEERS = ("graphfix", "onnxslim", "onnxsim")
HEADERS = ["model", "MiB", "nodes orig", "graphfix", "onnxslim", "onnxsim",
           "graphfix rollbacks", "rel err gf / slim / sim", "SQNR dB gf / slim / sim",
           "TRT-rejected ops (graphfix out)", "e2e s gf / slim / sim",
           "peak MiB gf / slim / sim", "2nd graphfix run"]


def _per_tool(row: dict, fmt) -> str:
    return " / ".join(fmt(row["tools"].get(t), row["eval"]["outputs"].get(t)) for t in PEERS)


def _nodes(row: dict, tool: str) -> str:
    out = row["eval"]["outputs"].get(tool)
    if out is None:
        failed = row["tools"].get(tool)
        return "not run" if failed is None else "failed"
    return str(out["nodes"]) if "nodes" in out else "error"


def _err(run: dict | None, out: dict | None) -> str:
    if out is None:
        return "—"
    if out.get("problem") or out.get("error"):
        return "✗"
    return "0" if out["rel_err"] == 0 else f"{out['rel_err']:.1e}"


def _sqnr(run: dict | None, out: dict | None) -> str:
    if out is None or "sqnr_db" not in out:
        return "—"
    return "inf" if math.isinf(out["sqnr_db"]) else f"{out['sqnr_db']:.0f}"


def _seconds(run: dict | None, out: dict | None) -> str:
    return f"{run['e2e_s']:.1f}" if run and "e2e_s" in run else "—"


def _mib(run: dict | None, out: dict | None) -> str:
    return f"{run['peak_mib']:.0f}" if run and "peak_mib" in run else "—"


def _specs(passes: list[dict], status: str) -> str:
    """The passes with `status`, in order, a repeated one once with its count (a preset
    repeats its passes in rounds until nothing changes)."""
    counts = Counter(p["spec"] for p in passes if p["status"] == status)
    return ", ".join(f"{spec} ×{n}" if n > 1 else spec for spec, n in counts.items())


def _rollbacks(row: dict) -> str:
    return _specs(row["tools"].get("graphfix", {}).get("passes", []), ROLLED_BACK) or "none"


def _second(row: dict) -> str:
    second = row.get("second")
    outputs = row["eval"]["outputs"]
    if second is None:
        return "—"
    if not second["ok"] or SECOND not in outputs:
        return f"failed: {second.get('error', 'not evaluated')[:60]}"
    before, after = outputs["graphfix"]["nodes"], outputs[SECOND]["nodes"]
    applied = _specs(second.get("passes", []), APPLIED)
    rolled = _specs(second.get("passes", []), ROLLED_BACK)
    if not applied and before == after:
        text = f"no change ({after})"
    else:
        text = f"CHANGED {before}→{after}: applied {applied or 'nothing'}"
    return text + (f"; rolled back: {rolled}" if rolled else "")


def row_cells(name: str, row: dict) -> list[str]:
    graphfix_out = row["eval"]["outputs"].get("graphfix", {})
    rejected = ", ".join(graphfix_out.get("trt_rejected", [])) or "none"
    return [name, f"{row['file_mb']:.0f}", str(row["eval"].get("original", {}).get("nodes", "?")),
            _nodes(row, "graphfix"), _nodes(row, "onnxslim"), _nodes(row, "onnxsim"),
            _rollbacks(row), _per_tool(row, _err), _per_tool(row, _sqnr),
            rejected if graphfix_out else "—", _per_tool(row, _seconds), _per_tool(row, _mib),
            _second(row)]


def main_table(data: dict) -> str:
    return table(HEADERS, [row_cells(n, r) for n, r in data["models"].items()])


def problems(data: dict) -> list[str]:
    """Rollback reasons, tool failures, checker failures and output mismatches; one line
    for each, repeats once with their count."""
    found: list[str] = []
    for name, row in data["models"].items():
        for tool, run in row["tools"].items():
            if not run["ok"]:
                found.append(f"{name}: {tool} failed: {run.get('error', '')}")
            for p in run.get("passes", []):
                if p["status"] == ROLLED_BACK:
                    found.append(f"{name}: graphfix rolled back {p['spec']}: {p['reason']}")
        if row["eval"].get("error") or row["eval"].get("reference_error"):
            found.append(f"{name}: evaluation: {row['eval'].get('error') or ''}"
                         f"{row['eval'].get('reference_error') or ''}")
        for label, out in row["eval"].get("outputs", {}).items():
            for key in ("error", "problem"):
                if out.get(key):
                    found.append(f"{name}: {label}: {out[key]}")
            if out.get("checker", "ok") != "ok":
                found.append(f"{name}: {label}: onnx.checker: {out['checker']}")
    return [f"{line} (×{n})" if n > 1 else line for line, n in Counter(found).items()]


def _commands(data: dict) -> str:
    """The commands whose rows the table shows (a row comes from the last run of it)."""
    source = {name: i for i, run in enumerate(data["runs"]) for name in run["models"]}
    rows = Counter(source[name] for name in data["models"] if name in source)
    runs = data["runs"]
    return "; ".join(f"`{runs[i]['command']}` ({runs[i]['runs']} timed run(s) per tool; "
                     f"{n} rows)" for i, n in sorted(rows.items()))


def _header(data: dict) -> list[str]:
    last = data["runs"][-1]
    dates = sorted({r["when"] for r in data["models"].values()})
    machine = last["machine"]
    span = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    tools = next(iter(data["models"].values()))["tools"]
    pipeline = tools.get("graphfix", {}).get("pipeline", "?")
    trt = next((r["eval"]["trt"] for r in data["models"].values() if "trt" in r["eval"]), "?")
    revisions = sorted({r.get("graphfix", "?") for r in data["models"].values()})
    return [
        "## Dev zoo (issue 16)", "",
        f"Generated by `bench/zoo.py run`, rows from {span}: {_commands(data)}. See "
        "bench/README.md, \"Zoo\".", "",
        "**Provisional timings; rerun alone.** These were taken on a shared 2-core VM with "
        "other work running; the node counts and numerics do not depend on that.", "",
        f"- Machine: {machine['cpu']}, {machine['cores']} cores, {machine['ram']}; "
        f"Python {machine['python']}",
        f"- Packages: {machine['packages']}",
        f"- graphfix source: {'; '.join(revisions)} (per row in the JSON)",
        f"- graphfix: its default pipeline `{pipeline}`, with its check, given each model's "
        "check shapes (bench/zoo_models.py); onnxslim and onnxsim: their defaults",
        "- nodes: every node, those in subgraphs (If/Loop/Scan bodies) included",
        "- rel err: worst over the outputs of max |out - orig| / max |orig|; SQNR: worst over "
        "the outputs; onnxruntime CPU, graph optimizations disabled, seeded inputs "
        "(bench/zoo_eval.py); ✗: the outputs do not compare (see below)",
        f"- TRT-rejected ops: graphfix doctor's error findings on graphfix's output, {trt}",
        "- e2e s / peak MiB: one fresh process per tool run (bench/child.py), medians",
        "- 2nd graphfix run: graphfix's default run on its own output; nodes before→after "
        "and the passes that applied (must be none)",
    ]


def section(data: dict) -> str:
    found = problems(data)
    parts = [BEGIN, *_header(data), "", main_table(data), "",
             "### Rollbacks, failures and problems", ""]
    parts += [f"- {p}" for p in found] or ["none"]
    return "\n".join([*parts, END])


def terminal(data: dict) -> str:
    return "\n".join([main_table(data), "", *problems(data)])


def write_section(path: Path, data: dict) -> None:
    text = path.read_text() if path.exists() else ""
    new = section(data)
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + new + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    path.write_text(text)
