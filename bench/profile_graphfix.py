"""Where `graphfix run` spends its time and memory, in one fresh process.

    python bench/profile_graphfix.py MODEL [--no-check] [--input-shape x:1x3x48x192]
                                     [--passes TEXT] [--cprofile OUT.prof] [--top 15]

Without --cprofile: an *accounting* run. The functions in `PROBES` (graphfix's load,
save, pass manager steps, each pass, the onnx / onnx-graphsurgeon / onnxruntime calls
they make) are wrapped; each call's time is charged to the innermost probe running
(self time, so the rows add up to the work), and each probe records the largest
RSS peak seen while it ran (VmHWM, reset through /proc/self/clear_refs at every
probe boundary) and how much RSS it left behind. With --cprofile: the same work
under cProfile, its top functions by cumulative and by self time.
`--passes`: the pipeline to run (default: graphfix's own default, no `passes` argument).
Prints `BENCH_PROFILE {json}` last on stdout.
"""

from __future__ import annotations

import cProfile
import functools
import importlib
import inspect
import io as _io
import json
import pstats
import resource
import sys
import time

T0 = time.perf_counter()

PROBES = [
    # (module, attribute path, label); missing ones are skipped (the code moves on)
    ("graphfix.io", "load", "io.load (read + parse)"),
    ("graphfix.io", "save", "io.save (other)"),
    ("graphfix.io", "runtime_ir_version", "io.save: probe onnxruntime IR version"),
    ("graphfix.io", "_serialize", "io.save: SerializeToString"),
    ("graphfix.io", "_commit", "io.save: write + fsync + rename"),
    ("graphfix.api", "run", "api.run (other)"),
    ("graphfix.api", "resolve_shapes", "api.run: resolve input shapes"),
    ("graphfix.runtime.outputs", "OutputCheck.prepare", "check: prepare (other)"),
    ("graphfix.runtime.outputs", "random_feeds", "check: random inputs"),
    ("graphfix.runtime.outputs", "run_model", "check: run_model (other)"),
    ("graphfix.runtime.session", "make_session", "check: make_session (other)"),
    ("onnxruntime", "InferenceSession.__init__", "check: ort.InferenceSession()"),
    ("onnxruntime", "InferenceSession.run", "check: ort session.run"),
    ("graphfix.runtime.outputs", "OutputCheck.verify", "check: verify (other)"),
    ("graphfix.runtime.outputs", "compare_outputs", "check: compare outputs"),
    ("graphfix.passes.manager", "run_passes", "manager: run_passes (other)"),
    ("graphfix.passes.manager", "_run_one", "manager: _run_one (other)"),
    ("graphfix.passes.manager", "Verifier.for_input", "verify: for_input (other)"),
    ("graphfix.passes.manager", "Verifier.problem", "verify: problem (other)"),
    ("graphfix.passes.manager", "_checker_error", "verify: onnx.checker"),
    ("graphfix.passes.manager", "_inference_error", "verify: shape inference"),
    ("graphfix.passes.manager", "to_graph", "gs.import_onnx (to_graph)"),
    ("graphfix.passes.manager", "to_model", "gs.export_onnx (to_model)"),
    ("graphfix.passes.manager", "fingerprint", "manager: fingerprint"),
    ("graphfix.passes.manager", "count_nodes", "manager: count_nodes"),
    ("graphfix.passes.cleanup", "Cleanup.run", "pass cleanup (own code)"),
    ("graphfix.passes.fold_constants", "FoldConstants.run", "pass fold-constants (own code)"),
    ("graphfix.passes.fold_bn", "FoldBatchNorm.run", "pass fold-bn (own code)"),
    ("onnx_graphsurgeon", "Graph.fold_constants", "gs Graph.fold_constants"),
    ("onnx_graphsurgeon", "Graph.cleanup", "gs Graph.cleanup"),
    ("onnx_graphsurgeon", "Graph.toposort", "gs Graph.toposort"),
]


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line[:5]] = int(line.split()[1])
    return out


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class Accountant:
    """Self time per probe; peak RSS while each probe (or a probe inside it) ran."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}
        self.stack: list[list] = []  # [label, start, child_time, peak_kib, rss_in]

    def wrap(self, label: str, fn):
        @functools.wraps(fn)
        def probe(*args, **kwargs):
            self._enter(label)
            try:
                return fn(*args, **kwargs)
            finally:
                self._exit()
        return probe

    def _enter(self, label: str) -> None:
        st = _status()
        if self.stack:
            self.stack[-1][3] = max(self.stack[-1][3], st["VmHWM"])
        _reset_peak()
        self.stack.append([label, time.perf_counter(), 0.0, st["VmRSS"], st["VmRSS"]])

    def _exit(self) -> None:
        st = _status()
        label, start, child, peak, rss_in = self.stack.pop()
        total = time.perf_counter() - start
        peak = max(peak, st["VmHWM"])
        row = self.rows.setdefault(label, {"calls": 0, "self_s": 0.0, "total_s": 0.0,
                                           "peak_kib": 0, "rss_growth_kib": 0})
        row["calls"] += 1
        row["self_s"] += total - child
        row["total_s"] += total
        row["peak_kib"] = max(row["peak_kib"], peak)
        row["rss_growth_kib"] += st["VmRSS"] - rss_in
        if self.stack:
            parent = self.stack[-1]
            parent[2] += total
            parent[3] = max(parent[3], peak)
        _reset_peak()


def install(acct: Accountant) -> list[str]:
    skipped = []
    for module_name, attr, label in PROBES:
        try:
            owner = importlib.import_module(module_name)
            *path, name = attr.split(".")
            for part in path:
                owner = getattr(owner, part)
            raw = inspect.getattr_static(owner, name)  # a classmethod stays one
        except (ImportError, AttributeError):
            skipped.append(f"{module_name}.{attr}")
            continue
        if isinstance(raw, classmethod):
            setattr(owner, name, classmethod(acct.wrap(label, raw.__func__)))
        else:
            setattr(owner, name, acct.wrap(label, raw))
    return skipped


def main(argv: list[str]) -> int:
    model_path = argv[0]
    check = "--no-check" not in argv
    shapes = {}
    if "--input-shape" in argv:
        name, dims = argv[argv.index("--input-shape") + 1].rsplit(":", 1)
        shapes[name] = [int(d) for d in dims.split("x")]
    prof_path = argv[argv.index("--cprofile") + 1] if "--cprofile" in argv else None
    top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 15
    out_path = argv[argv.index("-o") + 1] if "-o" in argv else "/tmp/graphfix-bench-prof.onnx"
    passes = {"passes": argv[argv.index("--passes") + 1]} if "--passes" in argv else {}

    import graphfix
    import graphfix.api
    import graphfix.io

    t_import = time.perf_counter() - T0
    rss_imports = _status()["VmRSS"]
    acct, skipped = Accountant(), []
    profiler = cProfile.Profile() if prof_path else None
    _reset_peak()
    t1 = time.perf_counter()
    if profiler:
        profiler.enable()
    else:  # graphfix imports onnxruntime lazily: charge that import to the work, as it is
        acct._enter("import onnxruntime (lazy, on first use)")
        import onnxruntime  # noqa: F401

        acct._exit()
        t_install = time.perf_counter()
        skipped = install(acct)
        t1 += time.perf_counter() - t_install  # wrapping the probes is not work
    model = graphfix.io.load(model_path)
    result = graphfix.api.run(model, check=check, input_shapes=shapes or None, **passes)
    graphfix.io.save(result.model, out_path)
    if profiler:
        profiler.disable()
    work = time.perf_counter() - t1
    final = _status()
    record = {"model": model_path, "check": check, "import_s": t_import, "work_s": work,
              "pipeline": passes.get("passes", graphfix.DEFAULT_PIPELINE),
              "rss_after_imports_kib": rss_imports, "rss_end_kib": final["VmRSS"],
              "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
              "passes": [[p.spec, p.status, round(p.seconds, 4)]
                         for p in result.report.passes]}
    if profiler:
        profiler.dump_stats(prof_path)
        record["cumulative"] = _top(profiler, "cumulative", top, work)
        record["self"] = _top(profiler, "tottime", top, work)
    else:
        record["probes"] = acct.rows
        record["probes_skipped"] = skipped
    print("BENCH_PROFILE " + json.dumps(record), flush=True)
    return 0


def _top(profiler: cProfile.Profile, key: str, n: int, work: float) -> list[dict]:
    stats = pstats.Stats(profiler, stream=_io.StringIO())
    stats.sort_stats(key)
    rows = []
    for func in stats.fcn_list:  # sorted by `key`
        cc, nc, tt, ct, _ = stats.stats[func]
        filename, line, name = func
        where = filename.split("site-packages/")[-1].split("/src/")[-1]
        label = f"{where}:{line}({name})" if line else name
        if key == "cumulative" and ("cProfile" in filename or name == "<module>"):
            continue
        rows.append({"func": label, "calls": nc, "self_s": tt, "cum_s": ct,
                     "share": (ct if key == "cumulative" else tt) / work})
        if len(rows) >= n:
            break
    return rows


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
