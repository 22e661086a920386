"""`python bench/zoo.py run`: every tool on every cached zoo model, measured and compared.

Per model: each tool runs `--runs` times in a fresh process (`bench/child.py`, started and
measured by `run_bench.run_child`: wall time from the parent, peak RSS from os.wait4),
the tools interleaved, after one untimed warm-up per tool on the smallest model of the
selection (it compiles each tool's byte code once, into a cache outside the source
trees, as `bench/run_bench.py` does). Then graphfix runs again, once, on its own last
output, and `bench/zoo_eval.py` measures the original and every last output. The
outputs are deleted after each model (hundreds of MB each) unless `--keep`.
Results merge into the JSON file (a rerun of some models replaces their rows, the
others stay) and the table of every model in it goes into RESULTS.md (`zoo_render`).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import run_bench
import zoo_models
from zoo_models import ZooModel

from graphfix.report import APPLIED, ROLLED_BACK, UNCHANGED

HERE = Path(__file__).resolve().parent
TOOLS = ("graphfix", "onnxslim", "onnxsim")
SECOND = "graphfix-second"
"""The label of graphfix's run on its own output."""
_PASS_LINE = re.compile(rf"^(?P<spec>.*?):(?P<status>{APPLIED}|{UNCHANGED}|{ROLLED_BACK})"
                        r"(?: \((?P<reason>.*)\))?$", re.DOTALL)


def _tools(text: str) -> list[str]:
    tools = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in tools if t not in TOOLS]
    if unknown or not tools:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or 'none'} given; "
                                         f"choose from {', '.join(TOOLS)}")
    return tools


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count of 1 or more")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tools", type=_tools, default=list(TOOLS),
                        help=f"comma-separated, from: {', '.join(TOOLS)} (default: all)")
    parser.add_argument("--runs", type=_count, default=1,
                        help="timed runs per (tool, model); medians are reported")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per process")
    parser.add_argument("--results", default=str(HERE / "RESULTS.md"),
                        help="Markdown file whose zoo section is rewritten ('' = none)")
    parser.add_argument("--json", default=None,
                        help="raw data, merged with earlier runs (default: CACHE/results.json)")
    parser.add_argument("--keep", action="store_true", help="keep the outputs' directory")


def run(args: argparse.Namespace, models: list[ZooModel], cache: Path) -> int:
    import zoo_render  # it imports this module

    tools = args.tools
    cached = {m.name: cache / m.file_name for m in models if (cache / m.file_name).exists()}
    missing = [m.name for m in models if m.name not in cached]
    if missing:
        print(f"not cached (run `python bench/zoo.py export {' '.join(missing)}`): "
              f"{', '.join(missing)}", file=sys.stderr)
    if not cached:
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="graphfix-zoo-"))
    run_bench.CHILD_ENV.pop("PYTHONDONTWRITEBYTECODE", None)  # see bench/README.md
    run_bench.CHILD_ENV["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
    rows = {}
    try:
        _warm_up(models, cached, tools, workdir, args.timeout)
        for spec in models:
            if spec.name in cached:
                rows[spec.name] = measure_model(spec, cached[spec.name], tools, args, workdir)
    finally:
        if args.keep:
            print(f"outputs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    json_path = Path(args.json) if args.json else cache / "results.json"
    data = merge(json_path, rows, _meta(args, tools))
    print(zoo_render.terminal(data))
    if args.results:
        zoo_render.write_section(Path(args.results), data)
        print(f"wrote {args.results} (zoo section) and {json_path}", file=sys.stderr)
    return 0


def _warm_up(models: list[ZooModel], cached: dict[str, Path], tools: list[str],
             workdir: Path, timeout: float) -> None:
    spec = min((m for m in models if m.name in cached),
               key=lambda m: zoo_models.model_mib(cached[m.name]))
    for tool in tools:
        cmd = run_bench.child_cmd(tool, str(cached[spec.name]), str(workdir / "warmup.onnx"),
                                  spec.check_shapes)
        run_bench.run_child(cmd, timeout)


def measure_model(spec: ZooModel, path: Path, tools: list[str], args: argparse.Namespace,
                  workdir: Path) -> dict:
    """One row's raw data: every tool's runs, graphfix's second run, the evaluation."""
    revision = graphfix_revision()
    outdir = workdir / spec.name
    outdir.mkdir()
    outputs = {tool: outdir / f"{tool}.onnx" for tool in (*tools, SECOND)}
    runs: dict[str, list[dict]] = {tool: [] for tool in tools}
    for i in range(args.runs):
        for tool in tools:
            cmd = run_bench.child_cmd(tool, str(path), str(outputs[tool]), spec.check_shapes)
            record = run_bench.run_child(cmd, args.timeout)
            runs[tool].append(record)
            state = f"{record['e2e_s']:7.1f} s" if record.get("ok") else \
                f"FAILED {record.get('error', '')[:100]}"
            print(f"  run {i + 1}/{args.runs}  {spec.name:30} {tool:9} {state}",
                  file=sys.stderr, flush=True)
    row = {"when": time.strftime("%Y-%m-%d %H:%M"), "graphfix": revision,
           "file_mb": zoo_models.model_mib(path),
           "check_shapes": spec.check_shapes, "tools": {t: summarize(r) for t, r in runs.items()}}
    done = {t: str(outputs[t]) for t in tools if runs[t][-1].get("ok")}
    if "graphfix" in done:
        cmd = run_bench.child_cmd("graphfix", done["graphfix"], str(outputs[SECOND]),
                                  spec.check_shapes)
        row["second"] = summarize([run_bench.run_child(cmd, args.timeout)])
        if row["second"]["ok"]:
            done[SECOND] = str(outputs[SECOND])
    row["eval"] = evaluate(spec, path, done, outdir, args.timeout)
    if not args.keep:
        shutil.rmtree(outdir, ignore_errors=True)
    return row


def graphfix_revision() -> str:
    """The graphfix source the children run: its git commit, marked when the files differ
    from it (an editable install runs whatever is in the tree at that moment)."""
    import graphfix

    src = Path(graphfix.__file__).resolve().parent
    try:
        head, changed = (subprocess.run(["git", "-C", str(src), *args], capture_output=True,
                                        text=True, check=True).stdout.strip()
                         for args in (["rev-parse", "--short", "HEAD"],
                                      ["status", "--porcelain", "--", "."]))
    except (OSError, subprocess.CalledProcessError):
        return f"{graphfix.__version__} (not a git checkout)"
    return head + (" + uncommitted changes" if changed else "")


def summarize(records: list[dict]) -> dict:
    """Medians over the successful runs; graphfix's pass records from the last one."""
    good = [r for r in records if r.get("ok")]
    summary: dict = {"ok": len(good) == len(records), "runs": len(records)}
    if len(good) < len(records):
        summary["error"] = next(r for r in records if not r.get("ok")).get("error", "")
    if good:
        summary["e2e_s"] = statistics.median(r["e2e_s"] for r in good)
        summary["work_s"] = statistics.median(r["work_s"] for r in good)
        summary["peak_mib"] = statistics.median(r["peak_kib"] for r in good) / 1024
        info = good[-1].get("info", {})
        if "passes" in info:
            summary["pipeline"] = info.get("pipeline", "")
            summary["check"] = info.get("check", "")
            summary["passes"] = [parse_pass(line) for line in info["passes"]]
    return summary


def parse_pass(line: str) -> dict:
    """`child.py`'s "spec:status (reason)" (the reason cut at 120 characters there)."""
    found = _PASS_LINE.match(line)
    if found is None:
        return {"spec": line, "status": "?", "reason": ""}
    return {"spec": found["spec"], "status": found["status"], "reason": found["reason"] or ""}


def evaluate(spec: ZooModel, path: Path, outputs: dict[str, str], outdir: Path,
             timeout: float) -> dict:
    spec_path = outdir / "eval.json"
    spec_path.write_text(json.dumps({"model": str(path), "shapes": spec.check_shapes,
                                     "outputs": outputs}))
    record = run_bench.run_child([sys.executable, str(HERE / "zoo_eval.py"), str(spec_path)],
                                 timeout)
    if "outputs" not in record:
        return {"error": record.get("error", "no result"), "outputs": {}}
    return {k: record[k] for k in ("trt", "original", "feeds", "outputs", "reference_error")
            if k in record}


def _meta(args: argparse.Namespace, tools: list[str]) -> dict:
    from render import machine  # bench/ is sys.path[0]

    return {"command": "python bench/zoo.py " + " ".join(sys.argv[1:]), "tools": tools,
            "runs": args.runs, "when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine()}


def merge(path: Path, rows: dict, meta: dict) -> dict:
    """The JSON file with these rows replacing earlier ones of the same models."""
    data = json.loads(path.read_text()) if path.exists() else {"runs": [], "models": {}}
    data["runs"].append({**meta, "models": sorted(rows)})
    data["models"].update(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return data
