"""One benchmark run: one tool on one model, in a fresh process.

    python bench/child.py TOOL MODEL OUT [--passes=TEXT] [NAME:DIMS ...]   (e.g. x:1x3x48x192)

Times its own phases with `time.perf_counter`: `import` (the tool's package, as a
user's script would import it) and `work` (load from file -> transform -> save to
file; imports the tool does lazily during that land here). Prints one line
`BENCH_RESULT {json}` last on stdout; a tool that raises is recorded with its
one-line error and the process exits 1. The parent measures wall time and peak RSS
of the whole process (os.wait4), so interpreter start-up counts the same for all.
graphfix runs `--passes` if given, else its own default pipeline (no `passes` argument);
the pipeline text it used is in the result's `info.pipeline`.
"""

from __future__ import annotations

import json
import resource
import sys
import time
import traceback

T_START = time.perf_counter()

def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _imports(tool: str) -> None:
    if tool == "floor":
        import onnx  # noqa: F401
    elif tool.startswith("graphfix"):
        import graphfix  # noqa: F401
    elif tool.startswith("onnxslim"):
        import onnx  # noqa: F401
        import onnxslim  # noqa: F401
    elif tool.startswith("onnxsim"):
        import onnx  # noqa: F401
        import onnxsim  # noqa: F401
    else:
        raise SystemExit(f"unknown tool {tool!r}")


def _shape_args(specs: list[str]) -> dict[str, list[int]]:
    shapes = {}
    for spec in specs:
        name, dims = spec.rsplit(":", 1)
        shapes[name] = [int(d) for d in dims.split("x")]
    return shapes


def work(tool: str, src: str, out: str, shapes: dict[str, list[int]],
         passes: str | None = None) -> dict:
    """load -> transform -> save with `tool`; returns tool-specific notes. `passes`: the
    graphfix pipeline text, None = graphfix's default (no `passes` argument given)."""
    info: dict = {}
    if tool == "floor":
        import onnx

        onnx.save(onnx.load(src), out)
    elif tool in ("graphfix", "graphfix-nocheck"):
        import graphfix

        kwargs = {} if passes is None else {"passes": passes}
        info["pipeline"] = graphfix.DEFAULT_PIPELINE if passes is None else passes
        # the path, as `graphfix run` gives it: large weights stay in their file and the
        # output is written from it (keep_weights=False, what the CLI passes)
        result = graphfix.run(src, check=tool == "graphfix", input_shapes=shapes or None,
                              output=out, keep_weights=False, **kwargs)
        info["passes"] = [f"{p.spec}:{p.status}" + (f" ({p.rollback_reason[:120]})"
                          if p.rollback_reason else "") for p in result.report.passes]
        info["check"] = result.report.check.skipped_reason or (
            "on" if result.report.check.enabled else "off")
    elif tool in ("onnxslim", "onnxslim-check"):
        import onnx
        import onnxslim

        kwargs: dict = {}
        if tool == "onnxslim-check":
            kwargs["model_check"] = True
            if shapes:
                kwargs["model_check_inputs"] = [
                    f"{k}:{','.join(map(str, v))}" for k, v in shapes.items()]
        slimmed = onnxslim.slim(onnx.load(src), **kwargs)
        if slimmed is None:
            raise RuntimeError("onnxslim's model check failed (slim returned None)")
        onnx.save(slimmed, out)
    elif tool in ("onnxsim", "onnxsim-check"):
        import onnx
        import onnxsim

        kwargs = {"check_n": 1 if tool == "onnxsim-check" else 0}
        if shapes:  # only for its check's random inputs; the input stays dynamic
            kwargs["test_input_shapes"] = shapes
        simplified, ok = onnxsim.simplify(onnx.load(src), **kwargs)
        if not ok:
            raise RuntimeError("onnxsim's check failed (simplify returned ok=False)")
        onnx.save(simplified, out)
    else:
        raise SystemExit(f"unknown tool {tool!r}")
    return info


def main(argv: list[str]) -> int:
    tool, src, out = argv[:3]
    passes = next((a.split("=", 1)[1] for a in argv[3:] if a.startswith("--passes=")), None)
    shapes = _shape_args([a for a in argv[3:] if not a.startswith("--passes=")])
    t0 = time.perf_counter()
    _imports(tool)
    t1 = time.perf_counter()
    rss_after_imports = _rss_kib()
    record = {"tool": tool, "ok": True, "error": "", "info": {}}
    try:
        record["info"] = work(tool, src, out, shapes, passes)
    except BaseException as err:  # every failure is a result, never a crash of the bench
        text = str(err).strip() or type(err).__name__
        record.update(ok=False, error=f"{type(err).__name__}: {text.splitlines()[0][:300]}",
                      traceback=traceback.format_exc()[-4000:])
    t2 = time.perf_counter()
    record.update(
        startup_s=t0 - T_START,
        import_s=t1 - t0,
        work_s=t2 - t1,
        rss_after_imports_kib=rss_after_imports,
        maxrss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    )
    sys.stdout.flush()
    print("BENCH_RESULT " + json.dumps(record), flush=True)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
