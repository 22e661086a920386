"""Experiment behind RESULTS.md: graphfix's check with onnxruntime's memory reuse off.

    python bench/exp_ort_mem_reuse.py MODEL [--runs 3] [--input-shape x:1x3x48x192]

For each run, two fresh processes: `graphfix.run(check=True)` + save as shipped, and
the same with `SessionOptions.enable_mem_reuse = False` patched into
`graphfix.runtime.session.session_options` (the sessions that run the original and
each rewrite). Prints work time, peak RSS, pass statuses and max errors of each, so
one can see that only the time changes. Also times one bare InferenceSession of
MODEL both ways. Patches nothing on disk.
"""

from __future__ import annotations

import subprocess
import sys
import time

CHILD = r"""
import resource, sys, time
import graphfix, graphfix.runtime.session as rt
path, mode, shape = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "no-reuse":
    shipped = rt.session_options
    def session_options():
        so = shipped()
        so.enable_mem_reuse = False
        return so
    rt.session_options = session_options
shapes = None
if shape:
    name, dims = shape.rsplit(":", 1)
    shapes = {name: tuple(int(d) for d in dims.split("x"))}
import onnxruntime as ort
so = rt.session_options()
t = time.perf_counter()
ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
session_s = time.perf_counter() - t
t = time.perf_counter()
result = graphfix.run(graphfix.load(path), check=True, input_shapes=shapes)
graphfix.save(result.model, "/tmp/graphfix-exp-mem-reuse.onnx")
work = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
passes = [(p.spec, p.status, p.max_abs_error) for p in result.report.passes]
print(f"{mode:9} session {session_s:.3f}s  graphfix check work {work:.3f}s  "
      f"peak {peak} MiB  {passes}")
"""


def main(argv: list[str]) -> int:
    model = argv[0]
    runs = int(argv[argv.index("--runs") + 1]) if "--runs" in argv else 3
    shape = argv[argv.index("--input-shape") + 1] if "--input-shape" in argv else ""
    for i in range(runs):
        for mode in ("shipped", "no-reuse"):
            t = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", CHILD, model, mode, shape],
                                 capture_output=True, text=True)
            line = (out.stdout.strip().splitlines() or [out.stderr.strip()[-300:]])[-1]
            print(f"run {i + 1}: {line}  (process {time.perf_counter() - t:.2f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
