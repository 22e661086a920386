"""Benchmark `graphfix run` against onnxslim, onnxsim and a bare onnx load+save.

    python bench/run_bench.py [--runs 5] [--models a,b] [--tools x,y] [--profile]

Every run is one tool on one model in a fresh process (`bench/child.py`): load from
file, transform, save to file. Reported per (tool, model): median wall time of the
whole process (interpreter start and imports included) and of the work alone,
median peak RSS of the process (os.wait4), and from the last run's output
(`bench/evaluate.py`): nodes left (subgraphs included), BatchNormalization and
Identity left, max abs output difference from the original under onnxruntime CPU
with graph optimizations off. A failure is recorded, never fatal. Results go to
the terminal and to bench/RESULTS.md (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS_DIR = Path(os.environ.get("GRAPHFIX_BENCH_MODELS",
                                 HERE.parent.parent / "shared" / "models"))

TOOLS = ["floor", "graphfix", "graphfix-nocheck", "onnxslim", "onnxsim", "onnxsim-check",
         "onnxslim-check"]
DEFAULT_TOOLS = TOOLS[:6]
TOOL_NOTES = {
    "floor": "onnx.load + onnx.save, nothing else",
    "graphfix": "graphfix.load -> graphfix.run(default pipeline, check=True) -> graphfix.save",
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
    """Run one child; wall time from the parent, peak RSS from os.wait4."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=HERE.parent, env=CHILD_ENV)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    record: dict = {"e2e_s": wall, "peak_kib": usage.ru_maxrss, "rc": proc.returncode}
    lines = [ln for ln in stdout.splitlines() if ln.startswith("BENCH_")]
    if lines:
        record.update(json.loads(lines[-1].split(" ", 1)[1]))
    else:
        tail = [ln for ln in stderr.strip().splitlines() if ln.strip()] or ["no output"]
        why = "timed out" if proc.returncode == -9 else f"exit code {proc.returncode}"
        record.update(ok=False, error=f"{why}: {tail[-1][:300]}")
    return record


def child_cmd(tool: str, model: str, out: str, shapes: dict) -> list[str]:
    extra = [f"{k}:{'x'.join(map(str, v))}" for k, v in shapes.items()]
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
        profiles = profile(models, workdir, args.timeout) if args.profile else {}
    finally:
        if args.keep:
            print(f"outputs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    command = "python bench/run_bench.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    meta = {"command": command, "runs": args.runs, "tools": tools, "models": names,
            "seconds": time.time() - started, "tool_notes": TOOL_NOTES,
            "inputs": {m: MODELS[m][1] for m in names}}
    print(render_terminal(table, meta))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "table": table, "runs": runs,
                                               "profiles": profiles}, indent=1, default=str))
    if args.results:
        render_markdown(Path(args.results), table, meta, profiles)
        print(f"wrote {args.results}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
