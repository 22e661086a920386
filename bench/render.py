"""Tables for the terminal and bench/RESULTS.md, from `run_bench.summarize`'s table.

RESULTS.md is rewritten on every run except the block between the ANALYSIS
markers, which holds the hand-written reading of the profile and is kept.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
from importlib import metadata
from pathlib import Path

ANALYSIS_BEGIN = "<!-- analysis:begin (kept when the bench rewrites this file) -->"
ANALYSIS_END = "<!-- analysis:end -->"
PEERS = ("onnxslim", "onnxsim", "onnxsim-check", "onnxslim-check")
PACKAGES = ("graphfix", "onnx", "onnx-graphsurgeon", "onnxruntime", "polygraphy", "numpy",
            "protobuf", "onnxslim", "onnxsim")
TIME_TARGET, MEM_TARGET = 1.5, 1.3
LATENCY_TOLERANCE = 1.05
"""A latency ratio up to this counts as "no slower" in the verdicts (noise, see the floor)."""
LEVELS = (("disable", "off", "ORT_DISABLE_ALL"), ("basic", "basic", "ORT_ENABLE_BASIC"))


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def _fmt(x, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if x is None else f"{x:{spec}}{suffix}"


def _mib(kib) -> float | None:
    return None if kib is None else kib / 1024


def _diff(row: dict) -> str:
    if "max_abs" not in row:
        return row.get("error", "—") if "nodes" not in row else "—"
    if row["max_abs"] is None:
        return f"mismatch: {row.get('note', '')}"
    return f"{row['max_abs']:.1e}" + (f" ({row['note']})" if row.get("note") else "")


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown pipe table, padded so it also reads as plain text."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                      *(line(r) for r in rows)])


def _affine(row: dict) -> str:
    """Conv -> Add / Mul by a constant, as `adds/muls` (see bench/evaluate.py)."""
    if "conv_add" not in row:
        return "—"
    return f"{row['conv_add']}/{row['conv_mul']}"


def main_table(results: dict) -> str:
    headers = ["model", "tool", "e2e s", "work s", "import s", "e2e ×floor", "work ×floor",
               "peak MiB", "peak ×floor", "nodes", "BN", "Id", "Conv→Add/Mul", "max |Δ|",
               "status"]
    rows = []
    for model, per_tool in results.items():
        floor = per_tool.get("floor", {})
        orig = per_tool.get("_original", {})
        rows.append([model, "(original)", "", "", "", "", "", "", "", str(orig.get("nodes", "?")),
                     str(orig.get("bn", "?")), str(orig.get("identity", "?")), _affine(orig),
                     "", ""])
        for tool, r in per_tool.items():
            if tool.startswith("_"):
                continue
            status = "ok" if not r.get("error") else f"FAILED: {r['error'][:90]}"
            if r.get("ok_runs") and r.get("error"):
                status = f"{r['ok_runs']}/{r['runs']} ok: {r['error'][:70]}"
            rows.append([
                "", tool, _fmt(r.get("e2e_s")), _fmt(r.get("work_s"), ".3f"),
                _fmt(r.get("import_s")),
                _fmt(_ratio(r.get("e2e_s"), floor.get("e2e_s")), ".2f", "×"),
                _fmt(_ratio(r.get("work_s"), floor.get("work_s")), ".1f", "×"),
                _fmt(_mib(r.get("peak_kib")), ".0f"),
                _fmt(_ratio(r.get("peak_kib"), floor.get("peak_kib")), ".2f", "×"),
                str(r.get("nodes", "—")), str(r.get("bn", "—")), str(r.get("identity", "—")),
                _affine(r), _diff(r), status])
    return table(headers, rows)


def op_changes_table(results: dict, top: int = 6) -> str:
    """Per output: the op types whose counts moved most against the original's."""
    rows = []
    for model, per_tool in results.items():
        orig = per_tool.get("_original", {}).get("ops")
        if not orig:
            continue
        first = True
        for tool, r in per_tool.items():
            if tool.startswith("_") or tool == "floor" or "ops" not in r:
                continue
            ops = r["ops"]
            moved = [(op, ops.get(op, 0) - orig.get(op, 0)) for op in set(orig) | set(ops)]
            moved = sorted((m for m in moved if m[1]), key=lambda m: (-abs(m[1]), m[0]))
            shown = ", ".join(f"{op} {d:+d}" for op, d in moved[:top])
            if len(moved) > top:
                shown += f", … ({len(moved) - top} more types)"
            rows.append([model if first else "", tool, str(r.get("nodes", "?")),
                         shown or "(none)"])
            first = False
    if not rows:
        return ""
    return table(["model", "tool", "nodes", f"largest op-count changes vs the original "
                  f"(top {top})"], rows)


def _best_peer(per_tool: dict, level: str, key: str = "median_ms"
               ) -> tuple[str | None, float | None]:
    found = [(r[level][key], t) for t, r in per_tool.items()
             if t in PEERS and key in r.get(level, {})]
    if not found:
        return None, None
    ms, tool = min(found)
    return tool, ms


def latency_table(lat: dict, results: dict) -> str:
    headers = ["model", "tool", "nodes", "Conv→Add/Mul"]
    for _, short, _ in LEVELS:
        headers += [f"{short}: median ms", f"{short}: p90 ms", f"{short}: min ms",
                    f"{short}: ×orig", f"{short}: ×best peer"]
    rows = []
    for model, per_tool in lat.items():
        first = True
        for tool, r in per_tool.items():
            info = results.get(model, {}).get("_original" if tool == "(original)" else tool, {})
            same = next((x.get("same_as") for x in r.values() if x.get("same_as")), None)
            cells = [model if first else "", tool + (f" (= {same})" if same else ""),
                     str(info.get("nodes", "?")), _affine(info)]
            first = False
            for level, _, _ in LEVELS:
                x = r.get(level, {})
                if "median_ms" not in x:
                    cells += [f"FAILED: {x.get('error', 'not run')[:60]}", "", "", "", ""]
                    continue
                orig = per_tool.get("(original)", {}).get(level, {}).get("median_ms")
                _, peer = _best_peer(per_tool, level)
                cells += [f"{x['median_ms']:.3f}", f"{x['p90_ms']:.3f}", f"{x['min_ms']:.3f}",
                          _fmt(_ratio(x["median_ms"], orig), ".2f", "×"),
                          _fmt(_ratio(x["median_ms"], peer), ".2f", "×")]
            rows.append(cells)
    return table(headers, rows)


def latency_verdicts(lat: dict) -> tuple[str, list[str]]:
    """graphfix's output against the original's and the best peer's latency, per level:
    by medians (the measure), and by minimums (the least disturbed call of each)."""
    tol = LATENCY_TOLERANCE
    headers = ["model", "opt level", "original ms", "graphfix ms", "×original", "best peer ms",
               "×best peer", "by min: ×orig / ×best peer", "floor ×orig (noise)",
               f"no slower (≤{tol:.2f}×)"]
    rows, misses = [], []
    for model, per_tool in lat.items():
        ours = [t for t in ("graphfix", "graphfix-nocheck") if t in per_tool
                and not any(x.get("same_as") for x in per_tool[t].values())]
        if not ours:
            rows.append([model, "—", "", "", "", "", "", "", "",
                         "n/a: graphfix left no output (it failed, see above)"])
            misses.append(f"{model}: no graphfix output to measure")
        for tool in ours:
            for level, _, name in LEVELS:
                def get(who, key="median_ms", level=level, per_tool=per_tool):
                    return per_tool.get(who, {}).get(level, {}).get(key)

                g, o, f = get(tool), get("(original)"), get("floor")
                peer, p = _best_peer(per_tool, level)
                _, p_min = _best_peer(per_tool, level, "min_ms")
                r_o, r_p = _ratio(g, o), _ratio(g, p)
                m_o = _ratio(get(tool, "min_ms"), get("(original)", "min_ms"))
                m_p = _ratio(get(tool, "min_ms"), p_min)
                bad = [what for what, r in (("original", r_o), ("best peer", r_p))
                       if r is not None and r > tol]
                bad_min = [r for r in (m_o, m_p) if r is not None and r > tol]
                if g is None:
                    verdict = "n/a"
                elif not bad:
                    verdict = "ok"
                elif not bad_min:
                    verdict = f"slower than {' and '.join(bad)} by median only: noise?"
                else:
                    verdict = f"SLOWER than {' and '.join(bad)} (median and min)"
                if bad:
                    misses.append(f"{model} {name} ({tool}): {verdict} "
                                  f"({_fmt(r_o, '.2f', '×')} original, "
                                  f"{_fmt(r_p, '.2f', '×')} {peer})")
                rows.append([model, name, _fmt(o, ".3f"),
                             _fmt(g, ".3f") + ("" if tool == "graphfix" else f" ({tool})"),
                             _fmt(r_o, ".2f", "×"),
                             "—" if peer is None else f"{p:.3f} ({peer})",
                             _fmt(r_p, ".2f", "×"),
                             f"{_fmt(m_o, '.2f', '×')} / {_fmt(m_p, '.2f', '×')}",
                             _fmt(_ratio(f, o), ".2f", "×"), verdict])
    return table(headers, rows), misses


def versus_table(results: dict, ours: str) -> str:
    headers = ["model", f"{ours} vs", "e2e time", "work time", "peak RSS", "nodes", "BN+Id"]
    rows = []
    for model, per_tool in results.items():
        g = per_tool.get(ours, {})
        for peer in PEERS:
            p = per_tool.get(peer)
            if p is None:
                continue
            if not g.get("e2e_s") or not p.get("e2e_s"):
                rows.append([model, peer, "—", "—", "—", "—",
                             f"({ours if not g.get('e2e_s') else peer} failed)"])
                continue
            left = lambda r: (r.get("bn", 0) or 0) + (r.get("identity", 0) or 0)  # noqa: E731
            rows.append([
                model, peer, _fmt(_ratio(g["e2e_s"], p["e2e_s"]), ".2f", "×"),
                _fmt(_ratio(g["work_s"], p["work_s"]), ".2f", "×"),
                _fmt(_ratio(g["peak_kib"], p["peak_kib"]), ".2f", "×"),
                f"{g.get('nodes', '?')} vs {p.get('nodes', '?')}",
                f"{left(g)} vs {left(p)}"])
    return table(headers, rows)


def targets(results: dict) -> tuple[str, list[str]]:
    """The issue's targets per model, measured; returns the table and the misses."""
    headers = ["model", "no-check e2e ≤1.5× floor", "no-check work ≤1.5× floor",
               "no-check peak ≤1.3× floor", "BN/Id ≤ peers", "check e2e < onnxsim",
               "check e2e < onnxsim-check"]
    rows, misses = [], []
    for model, t in results.items():
        floor, g, gn = t.get("floor", {}), t.get("graphfix", {}), t.get("graphfix-nocheck", {})
        cells = [model]

        def verdict(name, value, ok, shown, cells=cells, model=model):
            if value is None:
                cells.append("n/a")
                return
            cells.append(f"{'ok' if ok else 'MISS'} ({shown})")
            if not ok:
                misses.append(f"{model}: {name} ({shown})")

        r = _ratio(gn.get("e2e_s"), floor.get("e2e_s"))
        verdict("no-check e2e time", r, r is not None and r <= TIME_TARGET, _fmt(r, ".2f", "×"))
        r = _ratio(gn.get("work_s"), floor.get("work_s"))
        verdict("no-check work time", r, r is not None and r <= TIME_TARGET, _fmt(r, ".1f", "×"))
        r = _ratio(gn.get("peak_kib"), floor.get("peak_kib"))
        verdict("no-check peak RSS", r, r is not None and r <= MEM_TARGET, _fmt(r, ".2f", "×"))
        peers = [t[p] for p in ("onnxslim", "onnxsim") if p in t and "bn" in t[p]]
        if "bn" in gn and peers:
            best_bn = min(p["bn"] for p in peers)
            best_id = min(p["identity"] for p in peers)
            ok = gn["bn"] <= best_bn and gn["identity"] <= best_id
            verdict("BN/Identity left", 1, ok,
                    f"{gn['bn']}/{gn['identity']} vs best {best_bn}/{best_id}")
        else:
            cells.append("n/a")
        for peer in ("onnxsim", "onnxsim-check"):
            p = t.get(peer, {})
            r = _ratio(g.get("e2e_s"), p.get("e2e_s"))
            verdict(f"check e2e vs {peer}", r, r is not None and r < 1, _fmt(r, ".2f", "×"))
        rows.append(cells)
    return table(headers, rows), misses


def machine() -> dict[str, str]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        kib = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        ram = f"{kib / 1024 ** 2:.1f} GiB"
    except (OSError, AttributeError):
        ram = "?"
    versions = []
    for pkg in PACKAGES:
        try:
            versions.append(f"{pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{pkg} (not installed)")
    return {"cpu": cpu, "cores": f"{os.cpu_count()} ({len(os.sched_getaffinity(0))} usable)",
            "ram": ram, "python": platform.python_version(), "os": platform.platform(),
            "packages": ", ".join(versions)}


def render_terminal(results: dict, meta: dict, lat: dict | None = None) -> str:
    tgt, misses = targets(results)
    parts = [f"graphfix pipeline: {meta['pipeline']}", "", main_table(results), "",
             versus_table(results, "graphfix-nocheck"), "",
             versus_table(results, "graphfix"), "", tgt]
    if misses:
        parts += ["", "targets missed:", *(f"  - {m}" for m in misses)]
    if lat:
        verdicts, slower = latency_verdicts(lat)
        parts += ["", "onnxruntime CPU latency, 1 intra-op thread (off = ORT_DISABLE_ALL, "
                  "basic = ORT_ENABLE_BASIC):", latency_table(lat, results), "", verdicts]
        if slower:
            parts += ["", "latency: graphfix's output slower:", *(f"  - {m}" for m in slower)]
    parts.append(f"\n(bench took {meta['seconds']:.0f} s)")
    return "\n".join(parts)


def profile_section(profiles: dict) -> str:
    if not profiles:
        return ""
    out = ["## Profile of graphfix (generated)", "",
           "From `--profile`: `bench/profile_graphfix.py`, one fresh process per row group. "
           "*Accounting*: self time of each probed function (rows add up to the work; "
           "`(other)` = that function's own code outside the probes below it) and the "
           "highest RSS while it or a probe inside it ran (approximate: the HWM resets at every "
           "probe boundary); `RSS Δ` = RSS after the call minus before, inner calls included. "
           "*cProfile*: a second run under cProfile (slower; shares are of that run's work). "
           "Single runs: expect ±20 % on times.", ""]
    for key, prof in profiles.items():
        acct, cprof = prof["accounting"], prof["cprofile"]
        if not acct.get("probes"):
            out += [f"### {key}", "", f"profiling failed: {acct.get('error', '?')}", ""]
            continue
        work = acct["work_s"]
        out += [f"### {key}: work {work:.3f} s, RSS after imports "
                f"{acct['rss_after_imports_kib'] / 1024:.0f} MiB, at end "
                f"{acct['rss_end_kib'] / 1024:.0f} MiB", ""]
        probes = sorted(acct["probes"].items(), key=lambda kv: -kv[1]["self_s"])
        shown = [(label, p) for i, (label, p) in enumerate(probes)
                 if i < 12 or p["self_s"] >= 0.01 * work]
        rows = [[label, str(p["calls"]), f"{p['self_s']:.3f}", f"{100 * p['self_s'] / work:.0f}%",
                 f"{p['peak_kib'] / 1024:.0f}", f"{p['rss_growth_kib'] / 1024:+.0f}"]
                for label, p in shown]
        rest = sum(p["self_s"] for _, p in probes[len(shown):])
        unprobed = work - sum(p["self_s"] for _, p in probes)
        rows += [[f"({len(probes) - len(shown)} smaller probes)", "", f"{rest:.3f}",
                  f"{100 * rest / work:.0f}%", "", ""],
                 ["(outside every probe)", "", f"{unprobed:.3f}",
                  f"{100 * unprobed / work:.0f}%", "", ""]]
        out += [table(["probe", "calls", "self s", "share", "peak RSS MiB",
                       "RSS Δ MiB (incl. inner)"], rows), ""]
        if cprof.get("cumulative"):
            out += ["<details><summary>cProfile: top by cumulative and by self time "
                    f"(work {cprof['work_s']:.3f} s under the profiler)</summary>", "", "```"]
            for title, key_, rows_ in (("cumulative", "cum_s", cprof["cumulative"]),
                                        ("self", "self_s", cprof["self"])):
                out.append(f"-- by {title} time --")
                out += [f"{r[key_]:8.3f}s {100 * r['share']:5.1f}%  {r['calls']:>7}  {r['func']}"
                        for r in rows_]
            out += ["```", "</details>", ""]
    return "\n".join(out)


def pipeline_line(meta: dict) -> str:
    how = ("given with `--graphfix-passes`" if meta.get("pipeline_given") else
           "graphfix's default: `graphfix.DEFAULT_PIPELINE` read at run time, no `passes` "
           "argument given")
    line = f"- graphfix pipeline: `{meta.get('pipeline', '?')}` ({how})"
    used = meta.get("pipelines_used") or []
    if used and used != [meta.get("pipeline")]:
        line += (f". **The graphfix runs reported other pipelines: "
                 f"{', '.join(f'`{u}`' for u in used)}** (graphfix changed during the run?)")
    return line


def latency_section(lat: dict, results: dict, meta: dict) -> str:
    if not lat:
        return ""
    cfg = meta.get("latency") or {}
    verdicts, slower = latency_verdicts(lat)
    loads = [x["loadavg"] for per_tool in lat.values() for r in per_tool.values()
             for x in r.values() if "loadavg" in x]
    unit = ", ".join(f"{m}: {', '.join(v)}" for m, v in cfg.get("unit_inputs", {}).items())
    hint = (" Compare with the floor's `×orig`, and rerun with more `--latency-rounds` "
            "before believing a ratio under about 1.10×.")
    shapes = ", ".join(f"{m_}: {s}" for m_, s in meta["inputs"].items() if s) or "none"
    return f"""## Inference latency of the outputs (generated)

onnxruntime {_version('onnxruntime')} on CPU (`CPUExecutionProvider`), in fresh processes
(`bench/latency.py`), one at a time, never two at once:
`graph_optimization_level` **off** = `ORT_DISABLE_ALL`, **basic** = `ORT_ENABLE_BASIC`;
`intra_op_num_threads=1`, `inter_op_num_threads=1`, sequential execution, for stability
(so these are single-thread latencies, not what a multi-core deployment would see).
Batch 1: the seeded inputs of `bench/evaluate.py` (dynamic batch dims 1; shapes
{shapes}; inputs in [0, 1): {unit or 'none'}; the rest standard normal), the same
arrays for every file. Each (file, level) is measured in {cfg.get('rounds', '?')} processes
(rounds: every file once, then again, odd rounds in reverse order), each making
{cfg.get('warmup', '?')} untimed warm-up calls and then {cfg.get('per_process', '?')} timed
`session.run` calls (more for fast models: until {cfg.get('min_time_s', '?')} s of calls over
the rounds, at most 20× as many); the {cfg.get('runs', '?')}+ timed calls are pooled.
`median ms` / `p90 ms` / `min ms` = wall time per call (`time.perf_counter`; the raw
data also has each call's CPU time, which on this VM rises and falls with the wall time,
so it does not filter out the other work). `×orig` = median over the original's median
at the same level; `×best peer` = over the fastest peer output's
({', '.join(PEERS)}). Tools whose
outputs are byte-identical share one measurement, marked `(= tool)`; the floor is always
measured again: its file is the original's (byte-identical on these models), so its
`×orig` is pure measurement noise. The machine
is shared (2 cores, other work running): highest 1-minute load average seen during these
measurements {max(loads) if loads else float('nan'):.2f}. Other work on the machine slows
every call of a process for seconds at a time (up to about 2× seen), so one process's
median can be off by 10–80 %, hence the rounds: a spell that hits one of a file's
processes moves the pooled median much less. The minimum is steadier (within 5 % over 8
processes of the same file) but not immune. The verdicts below therefore also give the
ratios of the minimums: a ratio above {LATENCY_TOLERANCE:.2f}× by median but not by
minimum is most likely noise; rerun with more `--latency-rounds` (and a few `--models`)
to settle a verdict. `Conv→Add/Mul` = Conv nodes whose
only consumer is an Add / Mul by a constant (bias or scale left outside the Conv), as
adds/muls.

{latency_table(lat, results)}

### graphfix's output against the original and the best peer

{verdicts}

{"Slower: " + "; ".join(slower) + "." + hint if slower else _ALL_FAST}
"""


_ALL_FAST = (f"graphfix's output is no slower (≤ {LATENCY_TOLERANCE:.2f}×) than the original "
             "and the best peer everywhere.")


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def render_markdown(path: Path, results: dict, meta: dict, profiles: dict,
                    lat: dict | None = None) -> None:
    analysis = f"{ANALYSIS_BEGIN}\n## Reading\n\n(not written yet)\n{ANALYSIS_END}"
    from scale_render import BEGIN as SCALE_BEGIN
    from zoo_render import BEGIN as ZOO_BEGIN

    kept_zoo = ""  # zoo.py's and scale_bench.py's sections, the readings after: not this bench's
    if path.exists():
        old = path.read_text()
        if ANALYSIS_BEGIN in old and ANALYSIS_END in old:
            start = old.index(ANALYSIS_BEGIN)
            analysis = old[start:old.index(ANALYSIS_END) + len(ANALYSIS_END)]
        kept = [old.index(mark) for mark in (ZOO_BEGIN, SCALE_BEGIN) if mark in old]
        if kept:
            kept_zoo = "\n\n" + old[min(kept):].rstrip()
    m = machine()
    tgt, misses = targets(results)
    notes = "\n".join(f"- `{t}`: {meta['tool_notes'][t]}" for t in meta["tools"])
    shapes = ", ".join(f"{m_}: {s}" for m_, s in meta["inputs"].items() if s) or "none"
    text = f"""# graphfix vs peers: benchmark results

Generated by `bench/run_bench.py` on {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')} \
(took {meta['seconds']:.0f} s). See `bench/README.md` for what is measured and how.

- Command: `{meta['command']}`
- Machine: {m['cpu']}, {m['cores']} cores, {m['ram']} RAM; {m['os']}
- Python {m['python']}; {m['packages']}
{pipeline_line(meta)}
- Runs: {meta['runs']} per (tool, model), each in a fresh process, interleaved; medians shown.
- Latency of the outputs: {"measured, see *Inference latency of the outputs* below"
                           if lat else "not measured (no `--latency`)"}.
- Noise: a shared 2-core VM, with other work running at the same time; times vary by
  ±20–40 % from run to run.
- Input shapes given to every tool that takes them: {shapes}

Tools:
{notes}

{analysis}

## Results

`e2e` = wall time of the whole child process (interpreter start, imports, work) measured
by the parent; `work` = load → transform → save inside the child (lazy imports made during
the work count here); `import` = the tool's top-level import. `peak` = peak RSS of the
child process (`ru_maxrss` from `os.wait4`). `×floor` = ratio to `onnx.load` + `onnx.save`
of the same model. `nodes`, `BN` (BatchNormalization), `Id` (Identity) count subgraph nodes
too; `Conv→Add/Mul` = Conv nodes whose only consumer is an Add / Mul by a constant (a bias
or scale not folded into the Conv; TensorRT-unfriendly), as adds/muls. `max |Δ|` = largest
absolute difference of any output from the original's (onnxruntime CPU, graph
optimizations disabled, seeded inputs).

{main_table(results)}

### Op types that changed most

{op_changes_table(results)}

### graphfix --no-check against each peer (ratio < 1: graphfix is faster / smaller)

{versus_table(results, 'graphfix-nocheck')}

### graphfix with its check against each peer

{versus_table(results, 'graphfix')}

### Targets from the issue (measured)

{tgt}

{"Missed: " + "; ".join(misses) + "." if misses else "All targets met."}

{latency_section(lat or {}, results, meta)}

{profile_section(profiles)}
"""
    path.write_text(text.rstrip() + kept_zoo + "\n")
