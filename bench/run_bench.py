"""Benchmark `graphfix run` against onnxslim, onnxsim and a bare onnx load+save.

    python bench/run_bench.py [--runs 5] [--models a,b] [--tools x,y] [--profile]
                              [--graphfix-passes TEXT] [--latency [--latency-runs 30]]

Every run is one tool on one model in a fresh process (`bench/child.py`): load from
file, transform, save to file. Reported per (tool, model): median wall time of the
whole process (interpreter start and imports included) and of the work alone,
median peak RSS of the process (GNU time, bench/measure.py), and from the last run's output
(`bench/evaluate.py`): nodes left (subgraphs included), BatchNormalization and
Identity left, max abs output difference from the original under onnxruntime CPU
with graph optimizations off. With --latency: onnxruntime CPU inference latency of the
original and of every output (`bench/latency.py`, one process per model file and
optimization level, one at a time). A failure is recorded, never fatal. Results go to
the terminal and to bench/RESULTS.md (see bench/README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import run_measured

HERE = Path(__file__).resolve().parent
MODELS_DIR = Path(os.environ.get("GRAPHFIX_BENCH_MODELS",
                                 HERE.parent.parent / "shared" / "models"))

TOOLS = ["floor", "graphfix", "graphfix-nocheck", "onnxslim", "onnxsim", "onnxsim-check",
         "onnxslim-check"]
DEFAULT_TOOLS = TOOLS[:6]
LATENCY_LEVELS = ("disable", "basic")  # bench/latency.py: ORT_DISABLE_ALL, ORT_ENABLE_BASIC
LATENCY_MIN_TIME_S = 0.5
"""Fast models get more timed calls than --latency-runs: until this many seconds of them
per (file, level), over all rounds together (at most 20x the runs per process)."""
TOOL_NOTES = {
    "floor": "onnx.load + onnx.save, nothing else",
    "graphfix": "graphfix.run(PATH, PIPELINE, check=True, output=OUT) (what the CLI does)",
    "graphfix-nocheck": "the same with check=False (`graphfix run --no-check`)",
    "onnxslim": "onnx.load -> onnxslim.slim(model) -> onnx.save (its defaults: no check)",
    "onnxsim": "onnx.load -> onnxsim.simplify(model) -> onnx.save (its defaults: check_n=0)",
    "onnxsim-check": "onnxsim.simplify(model, check_n=1): one numerical check, like graphfix's",
    "onnxslim-check": "onnxslim.slim(model, model_check=True)",
}

# name -> (file in MODELS_DIR, or None for graphfix's built-in sample; input shapes used
# by every tool that takes them; inputs drawn from [0, 1) in the evaluation)
MODELS = {
    "sample": (None, {}, []),
    "digits_dev": ("digits_dev.onnx", {}, []),
    "mobilenet_v3_small_bn": ("mobilenet_v3_small_bn.onnx", {}, []),
    "ppocr_cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": [1, 3, 48, 192]}, []),
    "ssdlite320": ("ssdlite320_mobilenet_v3_large.onnx", {}, ["images"]),
}


CHILD_ENV = dict(os.environ)
"""The children's environment; `main` gives them a byte-code cache (see bench/README.md)."""


def run_child(cmd: list[str], timeout: float) -> dict:
    """Run one child (`measure.run_measured`: wall time from the parent, peak RSS from
    GNU time)."""
    run = run_measured(cmd, timeout, HERE.parent, CHILD_ENV)
    stdout, stderr = run["stdout"], run["stderr"]
    proc = subprocess.CompletedProcess(cmd, -9 if run["timed_out"] else run["rc"])
    record: dict = {"e2e_s": run["e2e_s"], "peak_kib": run["peak_kib"], "rc": proc.returncode}
    lines = [ln for ln in stdout.splitlines() if ln.startswith("BENCH_")]
    if lines:
        record.update(json.loads(lines[-1].split(" ", 1)[1]))
    else:
        tail = [ln for ln in stderr.strip().splitlines() if ln.strip()] or ["no output"]
        why = "timed out" if proc.returncode == -9 else f"exit code {proc.returncode}"
        record.update(ok=False, error=f"{why}: {tail[-1][:300]}")
    return record


GRAPHFIX_PASSES: str | None = None
"""`--graphfix-passes`; None = graphfix's default pipeline (no `passes` argument)."""


def child_cmd(tool: str, model: str, out: str, shapes: dict) -> list[str]:
    extra = [f"{k}:{'x'.join(map(str, v))}" for k, v in shapes.items()]
    if tool.startswith("graphfix") and GRAPHFIX_PASSES is not None:
        extra.insert(0, f"--passes={GRAPHFIX_PASSES}")
    return [sys.executable, str(HERE / "child.py"), tool, model, out, *extra]


def model_paths(names: list[str], workdir: Path) -> dict[str, Path]:
    paths = {}
    for name in names:
        file_name = MODELS[name][0]
        if file_name is None:
            import onnx

            from graphfix.samples import conv_bn_relu_residual

            paths[name] = workdir / "sample.onnx"
            onnx.save(conv_bn_relu_residual(), paths[name])
        else:
            paths[name] = MODELS_DIR / file_name
    return paths


def measure(args, models: dict[str, Path], tools: list[str], workdir: Path) -> dict:
    """All timed runs, interleaved (run i of every pair before run i+1 of any)."""
    runs: dict = {m: {t: [] for t in tools} for m in models}
    first = next(iter(models))
    for tool in tools:  # warm the page cache for each tool's modules; not recorded
        run_child(child_cmd(tool, str(models[first]), str(workdir / "warmup.onnx"),
                            MODELS[first][1]), args.timeout)
    for i in range(args.runs):
        for model, path in models.items():
            for tool in tools:
                out = workdir / model / f"{tool}.onnx"
                out.parent.mkdir(exist_ok=True)
                rec = run_child(child_cmd(tool, str(path), str(out), MODELS[model][1]),
                                args.timeout)
                runs[model][tool].append(rec)
                state = f"{rec['e2e_s']:6.2f}s" if rec.get("ok") else "FAILED"
                print(f"  run {i + 1}/{args.runs}  {model:22} {tool:17} {state}",
                      file=sys.stderr, flush=True)
    return runs


def evaluate(models: dict[str, Path], tools: list[str], runs: dict, workdir: Path,
             timeout: float) -> dict:
    evals = {}
    for model, path in models.items():
        outputs = {t: str(workdir / model / f"{t}.onnx") for t in tools
                   if runs[model][t] and runs[model][t][-1].get("ok")}
        spec = {"model": str(path), "shapes": MODELS[model][1], "unit_inputs": MODELS[model][2],
                "outputs": outputs}
        spec_path = workdir / model / "eval.json"
        spec_path.write_text(json.dumps(spec))
        rec = run_child([sys.executable, str(HERE / "evaluate.py"), str(spec_path)], timeout)
        evals[model] = rec if "tools" in rec else {"error": rec.get("error"), "tools": {}}
    return evals


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def latency(args, models: dict[str, Path], tools: list[str], runs: dict,
            workdir: Path) -> dict:
    """onnxruntime CPU latency of the original and of each tool's last output, per level.

    `bench/latency.py` processes, strictly one after another, never two at once. Tools
    whose outputs are byte-identical share one measurement (`same_as`), except the
    floor, which is always measured: it is the original's graph again, so its ratio to
    the original shows the measurement's noise. Every file is measured in
    --latency-rounds K processes, rounds interleaved (every file once, then again, odd
    rounds in reverse order), each with ceil(N / K) of the --latency-runs N timed calls;
    the samples are pooled, so the median is over at least N calls spread over K
    moments (a slow spell of the shared machine then hits one of them, not all).
    """
    per_process = -(-args.latency_runs // args.latency_rounds)
    min_time = LATENCY_MIN_TIME_S / args.latency_rounds
    plan: dict = {}  # model -> [(label, path, same_as)]
    for model, path in models.items():
        entries, seen = [("(original)", path, None)], {}
        for tool in tools:
            if not (runs[model][tool] and runs[model][tool][-1].get("ok")):
                continue
            out = workdir / model / f"{tool}.onnx"
            if not out.exists():
                continue
            digest = _sha256(out)
            if tool != "floor" and digest in seen:
                entries.append((tool, out, seen[digest]))
                continue
            if tool != "floor":
                seen[digest] = tool
            entries.append((tool, out, None))
        plan[model] = entries
    samples: dict = {m: {label: {lv: {"ms": [], "cpu_ms": [], "recs": []}
                                 for lv in LATENCY_LEVELS}
                         for label, _, same in entries if same is None}
                     for m, entries in plan.items()}
    for rnd in range(args.latency_rounds):
        for model, entries in plan.items():
            shapes, unit = MODELS[model][1], MODELS[model][2]
            extra = [a for k, v in shapes.items()
                     for a in ("--shape", f"{k}:{'x'.join(map(str, v))}")]
            extra += [a for name in unit for a in ("--unit", name)]
            for level in LATENCY_LEVELS:
                # odd rounds go backwards, so a slow spell of the machine is spread out
                for label, path, same in (entries if rnd % 2 == 0 else entries[::-1]):
                    if same is not None:
                        continue
                    cmd = [sys.executable, str(HERE / "latency.py"), str(path), "--level", level,
                           "--feeds-from", str(models[model]), "--runs", str(per_process),
                           "--min-time", f"{min_time:.4f}", "--warmup", str(args.latency_warmup),
                           *extra]
                    rec = run_child(cmd, args.timeout)
                    slot = samples[model][label][level]
                    slot["recs"].append({k: v for k, v in rec.items()
                                         if k not in ("samples_ms", "cpu_samples_ms")})
                    if rec.get("ok"):
                        slot["ms"] += rec["samples_ms"]
                        slot["cpu_ms"] += rec["cpu_samples_ms"]
                    state = (f"{statistics.median(rec['samples_ms']):8.3f} ms"
                             if rec.get("ok") else f"FAILED: {rec.get('error', '')[:80]}")
                    print(f"  latency {rnd + 1}/{args.latency_rounds}  {model:22} {label:17} "
                          f"{level:8} {state}", file=sys.stderr, flush=True)
    found: dict = {}
    for model, entries in plan.items():
        found[model] = {}
        for label, _, same in entries:
            found[model][label] = {}
            for level in LATENCY_LEVELS:
                if same is not None:
                    found[model][label][level] = {**found[model][same][level], "same_as": same}
                    continue
                slot = samples[model][label][level]
                recs = slot["recs"]
                if not slot["ms"]:
                    bad = next((r for r in recs if not r.get("ok")), {})
                    found[model][label][level] = {"error": bad.get("error", "not run")}
                    continue
                found[model][label][level] = {
                    "median_ms": statistics.median(slot["ms"]),
                    "p90_ms": _percentile(slot["ms"], 90),
                    "min_ms": min(slot["ms"]),
                    "cpu_median_ms": statistics.median(slot["cpu_ms"]),
                    "runs": len(slot["ms"]),
                    "session_s": statistics.median(r["session_s"] for r in recs if r.get("ok")),
                    "loadavg": max(max(r["loadavg_before"], r["loadavg_after"]) for r in recs),
                    **({"error": next(r["error"] for r in recs if not r.get("ok"))}
                       if any(not r.get("ok") for r in recs) else {}),
                    "processes": [{k: r.get(k) for k in (
                        "ok", "median_ms", "min_ms", "cpu_median_ms", "runs", "session_s",
                        "loadavg_before", "loadavg_after", "error")} for r in recs],
                }
    return found


def _percentile(values: list[float], q: float) -> float:
    from latency import percentile  # bench/ is sys.path[0]

    return percentile(values, q)


def summarize(runs: dict, evals: dict) -> dict:
    """Per (model, tool): medians over successful runs, evaluation, or the failure."""
    table: dict = {}
    for model, per_tool in runs.items():
        table[model] = {}
        for tool, recs in per_tool.items():
            good = [r for r in recs if r.get("ok")]
            row: dict = {"runs": len(recs), "ok_runs": len(good)}
            if len(good) < len(recs) or not recs:
                bad = next((r for r in recs if not r.get("ok")), {})
                row["error"] = bad.get("error", "not run")
            if good:
                for key in ("e2e_s", "import_s", "work_s", "peak_kib", "rss_after_imports_kib"):
                    row[key] = statistics.median(r[key] for r in good)
                row["work_min_s"] = min(r["work_s"] for r in good)
                row["info"] = good[-1].get("info", {})
            row.update(evals.get(model, {}).get("tools", {}).get(tool, {}))
            table[model][tool] = row
        table[model]["_original"] = evals.get(model, {}).get("original", {})
        table[model]["_eval_error"] = (evals.get(model, {}).get("error")
                                       or evals.get(model, {}).get("reference_error"))
    return table


def profile(models: dict[str, Path], workdir: Path, timeout: float) -> dict:
    """Accounting run and cProfile run of graphfix, with and without check, per model."""
    found: dict = {}
    for model, path in models.items():
        shapes = MODELS[model][1]
        extra = [a for k, v in shapes.items() for a in ("--input-shape",
                 f"{k}:{'x'.join(map(str, v))}")]
        for mode in ("graphfix", "graphfix-nocheck"):
            flags = ["--no-check"] if mode == "graphfix-nocheck" else []
            if GRAPHFIX_PASSES is not None:
                flags += ["--passes", GRAPHFIX_PASSES]
            base = [sys.executable, str(HERE / "profile_graphfix.py"), str(path), *extra, *flags,
                    "-o", str(workdir / model / f"prof-{mode}.onnx")]
            acct = run_child(base, timeout)
            prof = workdir / model / f"{mode}.prof"
            cprof = run_child([*base, "--cprofile", str(prof)], timeout)
            found[f"{model}/{mode}"] = {"accounting": acct, "cprofile": cprof,
                                        "prof_file": str(prof)}
            print(f"  profiled {model} {mode}", file=sys.stderr, flush=True)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per (tool, model)")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, from: {', '.join(MODELS)}")
    parser.add_argument("--tools", default=",".join(DEFAULT_TOOLS),
                        help=f"comma-separated, from: {', '.join(TOOLS)} ('all' = every one)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile graphfix (time and memory by function) per model")
    parser.add_argument("--graphfix-passes", default=None, metavar="TEXT",
                        help="pipeline for graphfix (e.g. trt-prep); default: graphfix's own "
                             "default pipeline (graphfix.DEFAULT_PIPELINE, read at run time)")
    parser.add_argument("--latency", action="store_true",
                        help="also measure onnxruntime CPU latency of the original and every "
                             "output (+3-4 minutes with all models)")
    parser.add_argument("--latency-runs", type=int, default=30,
                        help="timed session.run calls per (file, level), at least, over all "
                             "rounds (more for sub-ms models, to fill 0.5 s)")
    parser.add_argument("--latency-warmup", type=int, default=3,
                        help="untimed session.run calls at the start of every process")
    parser.add_argument("--latency-rounds", type=int, default=3,
                        help="processes per (file, level), interleaved; their timed calls "
                             "share --latency-runs and are pooled")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per child run")
    parser.add_argument("--results", default=str(HERE / "RESULTS.md"),
                        help="Markdown file to write ('' = do not write)")
    parser.add_argument("--json", default="", help="also write the raw results here")
    parser.add_argument("--keep", action="store_true", help="keep the outputs' directory")
    args = parser.parse_args(argv)

    from render import render_markdown, render_terminal  # bench/ is sys.path[0]

    names = [m.strip() for m in args.models.split(",") if m.strip()]
    tools = TOOLS if args.tools == "all" else [t.strip() for t in args.tools.split(",")]
    unknown = [n for n in names if n not in MODELS] + [t for t in tools if t not in TOOLS]
    if unknown:
        parser.error(f"unknown model or tool: {', '.join(unknown)}")
    if "floor" not in tools:
        tools.insert(0, "floor")  # every ratio is against it
    if args.latency_runs < 1 or args.latency_rounds < 1 or args.latency_warmup < 0:
        parser.error("--latency-runs and --latency-rounds must be >= 1, --latency-warmup >= 0")
    global GRAPHFIX_PASSES
    GRAPHFIX_PASSES = args.graphfix_passes
    try:
        import graphfix

        default_pipeline = graphfix.DEFAULT_PIPELINE
    except Exception as err:  # a broken checkout: the children will record the failure
        default_pipeline = f"(import graphfix failed: {type(err).__name__}: {err})"
    pipeline = default_pipeline if args.graphfix_passes is None else args.graphfix_passes
    workdir = Path(tempfile.mkdtemp(prefix="graphfix-bench-"))
    # Every tool's modules get .pyc files, written once (in the warm-up) outside the source
    # trees: PYTHONDONTWRITEBYTECODE would leave an editable graphfix compiling its source
    # in every run while the peers' wheels come with byte code.
    CHILD_ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    CHILD_ENV["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
    started = time.time()
    try:
        models = model_paths(names, workdir)
        runs = measure(args, models, tools, workdir)
        evals = evaluate(models, tools, runs, workdir, args.timeout)
        table = summarize(runs, evals)
        lat = latency(args, models, tools, runs, workdir) if args.latency else {}
        profiles = profile(models, workdir, args.timeout) if args.profile else {}
    finally:
        if args.keep:
            print(f"outputs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    command = "python bench/run_bench.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    used = sorted({r.get("info", {}).get("pipeline") for m in runs.values()
                   for t, recs in m.items() if t.startswith("graphfix") for r in recs
                   if r.get("info", {}).get("pipeline")})
    notes = {t: n.replace("PIPELINE", repr(pipeline)) for t, n in TOOL_NOTES.items()}
    meta = {"command": command, "runs": args.runs, "tools": tools, "models": names,
            "seconds": time.time() - started, "tool_notes": notes,
            "inputs": {m: MODELS[m][1] for m in names},
            "pipeline": pipeline, "pipeline_given": args.graphfix_passes is not None,
            "default_pipeline": default_pipeline, "pipelines_used": used,
            "latency": {"runs": args.latency_runs, "warmup": args.latency_warmup,
                        "rounds": args.latency_rounds, "min_time_s": LATENCY_MIN_TIME_S,
                        "per_process": -(-args.latency_runs // args.latency_rounds),
                        "unit_inputs": {m: MODELS[m][2] for m in names if MODELS[m][2]}}
            if args.latency else None}
    if used and used != [pipeline]:
        print(f"WARNING: graphfix's runs used other pipelines than {pipeline!r}: {used} "
              "(did graphfix.DEFAULT_PIPELINE change during the run?)", file=sys.stderr)
    print(render_terminal(table, meta, lat))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "table": table, "runs": runs,
                                               "latency": lat, "profiles": profiles},
                                              indent=1, default=str))
    if args.results:
        render_markdown(Path(args.results), table, meta, profiles, lat)
        print(f"wrote {args.results}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
