"""graphfix at scale (issue 18): whole-process wall time and peak RSS against the floor,
the peers and polygraphy, on the shared models, the zoo's large models and a synthetic
model of 10, 100, 1000 blocks.

    python bench/scale_bench.py [--models shared,zoo,synthetic | NAME,...] [--blocks 10,100,1000]
                                [--runs N] [--timeout S] [--json PATH] [--no-write]
    python bench/scale_bench.py --render-only PATH [--no-write]

Every measurement is one fresh process; the parent takes its wall time and its peak RSS
(GNU time's %M, which forks the tool from its own small image). Per model, run i of
every tool comes before run i+1 of any (A B A B); medians of the successful runs are
reported. A run that fails or times out (`--timeout`, the process group is killed) is
recorded with its reason. Tools, in order:

- `floor`, `onnxslim`, `onnxsim`, `onnxsim-check`: `bench/child.py` (load -> transform ->
  save through the tool's Python API, the peers with their defaults; `onnxsim-check` is
  check_n=1). `child.py` gives onnxsim the shapes as `test_input_shapes`.
- `graphfix-nocheck`, `graphfix`: the CLI, `python -m graphfix run MODEL -o OUT
  [--no-check] [--input-shape ...]`.
- `graphfix-check`: `python -m graphfix check MODEL REWRITTEN --samples 1 --seed 0`,
  REWRITTEN = this run's `graphfix` output.
- `polygraphy`: `polygraphy run MODEL --onnxrt --onnx-outputs mark all --seed 0` (one run
  of the reference, no comparison); `polygraphy-save` / `polygraphy-load`: the same with
  `--save-outputs ref.json`, then on REWRITTEN with `--load-outputs ref.json` (the
  comparison users make with polygraphy: time = sum, peak = max of the two).

The raw records go to `--json` (default: a file in the work dir, kept), the section between
`<!-- scale:begin -->` and `<!-- scale:end -->` of bench/RESULTS.md is rewritten from them
(`bench/scale_render.py`). See bench/README.md, "Scale".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import scale_models
import scale_render
import zoo_models
from measure import run_measured
from scale_models import BenchModel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHILD_TOOLS = ("floor", "onnxslim", "onnxsim", "onnxsim-check")
REWRITE_TOOLS = ("floor", "graphfix-nocheck", "graphfix", "onnxslim", "onnxsim", "onnxsim-check")
CHECK_TOOLS = ("graphfix-check", "polygraphy", "polygraphy-save", "polygraphy-load")
TOOLS = REWRITE_TOOLS + CHECK_TOOLS
SEED = 0
TAIL = 600
"""Characters of a run's stdout and stderr kept in the JSON."""
TOOL_NOTES = {
    "floor": "`bench/child.py floor`: onnx.load + onnx.save in a fresh Python",
    "graphfix-nocheck": "`python -m graphfix run MODEL -o OUT --no-check` (default pipeline)",
    "graphfix": "`python -m graphfix run MODEL -o OUT` (check after every pass)",
    "onnxslim": "`bench/child.py onnxslim`: onnxslim.slim(model), its defaults (no check)",
    "onnxsim": "`bench/child.py onnxsim`: onnxsim.simplify(model, check_n=0)",
    "onnxsim-check": "`bench/child.py onnxsim-check`: onnxsim.simplify(model, check_n=1)",
    "graphfix-check": f"`python -m graphfix check MODEL REWRITTEN --samples 1 --seed {SEED}`",
    "polygraphy": f"`polygraphy run MODEL --onnxrt --onnx-outputs mark all --seed {SEED}`",
    "polygraphy-save": "the same with `--save-outputs ref.json`",
    "polygraphy-load": "`polygraphy run REWRITTEN --onnxrt --onnx-outputs mark all "
                       f"--seed {SEED} --load-outputs ref.json`",
}
ENV = dict(os.environ)
"""The children's environment (`main` adds a byte-code cache and a wide console)."""
_WROTE = re.compile(r"wrote .*?\((\d+) → (\d+) nodes")


def run_process(cmd: list[str], timeout: float) -> dict:
    """One process (`measure.run_measured`): wall time, peak RSS, exit code, output."""
    run = run_measured(cmd, timeout, ROOT, ENV)
    return {"e2e_s": run["e2e_s"], "peak_mib": run["peak_kib"] / 1024, "rc": run["rc"],
            "timed_out": run["timed_out"], "stdout": run["stdout"], "stderr": run["stderr"]}


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def judge(tool: str, proc: dict, out: Path | None, timeout: float) -> dict:
    """The record of one run: ok, the reason when not, what the tool reported."""
    stdout, stderr = proc.pop("stdout"), proc.pop("stderr")
    rec = {**proc, "ok": False, "error": "", "stdout_tail": stdout[-TAIL:],
           "stderr_tail": stderr[-TAIL:]}
    if proc["timed_out"]:
        rec["error"] = f"timed out after {timeout:.0f} s"
        return rec
    if tool in CHILD_TOOLS:
        found = [ln for ln in stdout.splitlines() if ln.startswith("BENCH_RESULT ")]
        child = json.loads(found[-1].split(" ", 1)[1]) if found else {}
        rec.update(ok=bool(child.get("ok")) and proc["rc"] == 0,
                   error=child.get("error") or ("" if found else
                                                f"exit code {proc['rc']}: {_last_line(stderr)}"),
                   work_s=child.get("work_s"), import_s=child.get("import_s"))
    elif tool in ("graphfix", "graphfix-nocheck"):
        wrote = _WROTE.search(" ".join(stdout.split()))
        rec["ok"] = proc["rc"] == 0 and out is not None and out.exists()
        if wrote:
            rec["nodes_before"], rec["nodes_after"] = int(wrote[1]), int(wrote[2])
        rec["rolled_back"] = "rolled back" in stdout
    elif tool == "graphfix-check":  # 0: agree, 1: differ, 2/3: user error, internal bug
        rec["ok"] = proc["rc"] in (0, 1)
        rec["verdict"] = {0: "agree", 1: "differ"}.get(proc["rc"], "")
    elif tool == "polygraphy-load":
        verdict = re.findall(r"\b(PASSED|FAILED) \| Runtime", stdout + stderr)
        rec["ok"] = bool(verdict)
        rec["verdict"] = verdict[-1] if verdict else ""
    else:  # polygraphy, polygraphy-save
        rec["ok"] = proc["rc"] == 0
    if not rec["ok"] and not rec["error"]:
        said = _last_line(stderr if stderr.strip() else stdout)
        rec["error"] = f"exit code {proc['rc']}: {said}"
    return rec


def _polygraphy() -> str:
    return shutil.which("polygraphy", path=str(Path(sys.executable).parent)) or "polygraphy"


def command(tool: str, model: BenchModel, outdir: Path) -> tuple[list[str], Path | None, str]:
    """(argv, the file it writes, what it needs first: '' or a tool whose file it reads)."""
    src, py = str(model.path), sys.executable
    out = outdir / f"{tool}.onnx"
    rewritten, ref = outdir / "graphfix.onnx", outdir / "ref.json"
    gf_shapes = [a for s in model.shape_specs() for a in ("--input-shape", s)]
    poly = [_polygraphy(), "run", "--onnxrt", "--onnx-outputs", "mark", "all", "--seed",
            str(SEED), *model.polygraphy_shapes()]
    if tool in CHILD_TOOLS:
        return [py, str(HERE / "child.py"), tool, src, str(out), *model.shape_specs()], out, ""
    if tool in ("graphfix", "graphfix-nocheck"):
        flags = ["--no-check"] if tool == "graphfix-nocheck" else []
        return [py, "-m", "graphfix", "run", src, "-o", str(out), *flags, *gf_shapes], out, ""
    if tool == "graphfix-check":
        return ([py, "-m", "graphfix", "check", src, str(rewritten), "--samples", "1",
                 "--seed", str(SEED), *gf_shapes], None, "graphfix")
    if tool == "polygraphy":
        return [*poly[:2], src, *poly[2:]], None, ""
    if tool == "polygraphy-save":
        return [*poly[:2], src, *poly[2:], "--save-outputs", str(ref)], ref, ""
    if tool == "polygraphy-load":
        return ([*poly[:2], str(rewritten), *poly[2:], "--load-outputs", str(ref)], None,
                "graphfix,polygraphy-save")
    raise ValueError(f"unknown tool {tool!r}")


def one_round(model: BenchModel, outdir: Path, timeout: float, label: str) -> dict:
    """Every tool once on `model`; a tool whose input is missing is recorded as not run."""
    done: dict[str, dict] = {}
    for tool in TOOLS:
        cmd, out, needs = command(tool, model, outdir)
        missing = [t for t in needs.split(",") if t and not done[t]["ok"]]
        if missing:
            done[tool] = {"ok": False, "error": f"not run: {', '.join(missing)} failed",
                          "e2e_s": None, "peak_mib": None}
        else:
            if out is not None and out.exists():
                out.unlink()
            done[tool] = judge(tool, run_process(cmd, timeout), out, timeout)
            done[tool]["argv"] = cmd
        rec = done[tool]
        state = f"{rec['e2e_s']:8.2f} s {rec['peak_mib']:7.0f} MiB" if rec["ok"] else \
            f"FAILED {rec['error'][:100]}"
        print(f"  {label} {model.name:28} {tool:17} {state}", file=sys.stderr, flush=True)
    (outdir / "ref.json").unlink(missing_ok=True)  # all tensors: can be GBs
    return done


def summarize(records: list[dict]) -> dict:
    """Medians over the successful runs, and every distinct failure reason."""
    good = [r for r in records if r.get("ok")]
    row: dict = {"runs": len(records), "ok_runs": len(good),
                 "errors": sorted({r["error"] for r in records if not r.get("ok")})}
    if good:
        row["e2e_s"] = statistics.median(r["e2e_s"] for r in good)
        row["peak_mib"] = statistics.median(r["peak_mib"] for r in good)
        for key in ("verdict", "nodes_before", "nodes_after", "rolled_back"):
            if key in good[-1]:
                row[key] = good[-1][key]
    return row


def save_load(save: list[dict], load: list[dict]) -> dict:
    """polygraphy's save-then-compare per run: time = sum, peak = max of the two."""
    pairs = [{"ok": s.get("ok") and lo.get("ok"),
              "e2e_s": (s["e2e_s"] or 0) + (lo["e2e_s"] or 0),
              "peak_mib": max(s["peak_mib"] or 0, lo["peak_mib"] or 0),
              "verdict": lo.get("verdict", ""), "error": s.get("error") or lo.get("error", "")}
             for s, lo in zip(save, load, strict=True)]
    return summarize(pairs)


def measure_model(model: BenchModel, args: argparse.Namespace, workdir: Path) -> dict:
    outdir = workdir / model.name
    outdir.mkdir(exist_ok=True)
    runs: dict[str, list[dict]] = {t: [] for t in TOOLS}
    for i in range(args.runs):
        for tool, rec in one_round(model, outdir, args.timeout, f"run {i + 1}/{args.runs}").items():
            runs[tool].append(rec)
    summary = {t: summarize(r) for t, r in runs.items()}
    summary["polygraphy-save+load"] = save_load(runs["polygraphy-save"], runs["polygraphy-load"])
    row = {"group": model.group, "file": str(model.path),
           "file_mb": zoo_models.model_mib(model.path), "blocks": model.blocks,
           "nodes": model.nodes or summary["graphfix-nocheck"].get("nodes_before"),
           "shapes": {k: list(v) for k, v in model.shapes.items()},
           "summary": summary, "runs": runs}
    if not args.keep:
        shutil.rmtree(outdir, ignore_errors=True)
    return row


def meta(args: argparse.Namespace, argv: list[str], models: list[BenchModel]) -> dict:
    from render import machine
    from zoo_run import graphfix_revision

    try:
        import graphfix

        pipeline = graphfix.DEFAULT_PIPELINE
    except Exception as err:  # the children record the failure
        pipeline = f"(import graphfix failed: {type(err).__name__}: {err})"
    return {"command": "python bench/scale_bench.py " + " ".join(argv),
            "when": time.strftime("%Y-%m-%d %H:%M"), "runs": args.runs,
            "timeout_s": args.timeout, "seed": SEED, "blocks": list(args.blocks),
            "synthetic": {"channels": scale_models.SYNTH_CHANNELS,
                          "side": scale_models.SYNTH_SIDE},
            "models": [m.name for m in models], "tools": list(TOOLS), "tool_notes": TOOL_NOTES,
            "pipeline": pipeline, "graphfix": graphfix_revision(), "machine": machine(),
            "loadavg_start": os.getloadavg()}


def _blocks(text: str) -> tuple[int, ...]:
    try:
        found = tuple(sorted({int(t) for t in text.split(",") if t.strip()}))
    except ValueError:
        found = ()
    if not found or min(found) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give block counts >= 1, e.g. 10,100,1000")
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="shared,zoo,synthetic",
                        help="groups (shared, zoo, synthetic) and/or model names, comma-separated")
    parser.add_argument("--blocks", type=_blocks, default=scale_models.DEFAULT_BLOCKS,
                        help="the synthetic model's block counts (default 10,100,1000)")
    parser.add_argument("--runs", type=int, default=1, help="runs per (tool, model); medians")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per process")
    parser.add_argument("--json", default="", help="raw data (default: in the work dir)")
    parser.add_argument("--no-write", action="store_true", help="leave bench/RESULTS.md as it is")
    parser.add_argument("--results", default=str(HERE / "RESULTS.md"), help=argparse.SUPPRESS)
    parser.add_argument("--render-only", metavar="JSON", default="",
                        help="render the section from a saved --json file, measure nothing")
    parser.add_argument("--cache", default=None, help="the zoo's folder (as bench/zoo.py)")
    parser.add_argument("--keep", action="store_true", help="keep the outputs' directory")
    args = parser.parse_args(argv)
    if args.render_only:
        return publish(json.loads(Path(args.render_only).read_text()), args)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    try:
        models = scale_models.select(args.models, args.blocks, zoo_models.cache_dir(args.cache))
    except ValueError as err:
        parser.error(str(err))
    workdir = Path(tempfile.mkdtemp(prefix="graphfix-scale-"))
    ENV.pop("PYTHONDONTWRITEBYTECODE", None)  # byte code compiled once (bench/README.md)
    ENV.update(PYTHONPYCACHEPREFIX=str(workdir / "pycache"), COLUMNS="400")
    json_path = Path(args.json) if args.json else workdir / "scale.json"
    started = time.time()
    data = {"meta": meta(args, argv, models), "models": {}}
    try:
        models = [scale_models.build(m, workdir) for m in models]
        smallest = min(models, key=lambda m: zoo_models.model_mib(m.path))
        warm = workdir / "warmup"
        warm.mkdir()
        data["warmup"] = {"model": smallest.name,
                          "runs": one_round(smallest, warm, args.timeout, "warm-up")}
        for model in models:
            data["models"][model.name] = measure_model(model, args, workdir)
            data["meta"]["seconds"] = time.time() - started
            json_path.write_text(json.dumps(data, indent=1))  # partial results survive
    finally:
        data["meta"]["seconds"] = time.time() - started
        data["meta"]["loadavg_end"] = os.getloadavg()
        json_path.write_text(json.dumps(data, indent=1))
        print(f"raw data: {json_path}", file=sys.stderr)
        if args.keep:
            print(f"outputs kept in {workdir}", file=sys.stderr)
        elif json_path.parent == workdir:  # keep only the raw data
            for child in workdir.iterdir():
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                elif child != json_path:
                    child.unlink()
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return publish(data, args)


def publish(data: dict, args: argparse.Namespace) -> int:
    section = scale_render.section(data)
    print(section)
    if not args.no_write and args.results:
        scale_render.write_section(Path(args.results), section)
        print(f"wrote {args.results} (scale section)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
