"""onnxruntime CPU inference latency of one model at one optimization level, in a fresh process.

    python bench/latency.py MODEL --level disable|basic [--feeds-from ORIGINAL]
                            [--runs 30] [--warmup 5] [--min-time 0.5]
                            [--shape x:1x3x48x192 ...] [--unit images ...]

One `InferenceSession` on CPUExecutionProvider with `graph_optimization_level`
ORT_DISABLE_ALL (`disable`) or ORT_ENABLE_BASIC (`basic`), `intra_op_num_threads=1`,
`inter_op_num_threads=1`, sequential execution. Inputs are `evaluate.make_feeds` of
ORIGINAL (default MODEL): np.random.default_rng(0), dynamic batch dims 1, the given
shapes, [0, 1) for the `--unit` inputs, so every tool's output runs on the same data.
`--warmup` untimed `session.run` calls, then at least `--runs` timed ones, more if they
take under `--min-time` seconds together (at most 20x `--runs`). Each call is timed
with `time.perf_counter` (wall) and `time.thread_time` (CPU time of this thread: with
one intra-op thread onnxruntime computes on the calling thread, so this one is
insensitive to other processes taking the cores). Prints `BENCH_LATENCY {json}` last
on stdout; a failure is recorded with its one-line error and the process exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC"}


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def measure(args) -> dict:
    import onnx
    import onnxruntime as ort
    from evaluate import make_feeds  # bench/ is sys.path[0]

    shapes = {}
    for spec in args.shape:
        name, dims = spec.rsplit(":", 1)
        shapes[name] = [int(d) for d in dims.split("x")]
    feeds = make_feeds(onnx.load(args.feeds_from or args.model, load_external_data=False),
                       shapes, set(args.unit))

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[args.level])
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    t0 = time.perf_counter()
    session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    session_s = time.perf_counter() - t0
    wanted = [i.name for i in session.get_inputs()]
    missing = [n for n in wanted if n not in feeds]
    if missing:
        raise ValueError(f"the model wants inputs the original does not have: {missing}")
    feed = {n: feeds[n] for n in wanted}

    for _ in range(args.warmup):
        session.run(None, feed)
    wall: list[float] = []
    cpu: list[float] = []
    limit = 20 * args.runs
    started = time.perf_counter()
    while len(wall) < args.runs or (time.perf_counter() - started < args.min_time
                                    and len(wall) < limit):
        c0 = time.thread_time()
        w0 = time.perf_counter()
        session.run(None, feed)
        w1 = time.perf_counter()
        c1 = time.thread_time()
        wall.append(w1 - w0)
        cpu.append(c1 - c0)
    ms = [1000 * x for x in wall]
    cpu_ms = [1000 * x for x in cpu]
    return {"median_ms": statistics.median(ms), "p90_ms": percentile(ms, 90),
            "min_ms": min(ms), "mean_ms": statistics.fmean(ms),
            "cpu_median_ms": statistics.median(cpu_ms), "runs": len(ms),
            "warmup": args.warmup, "session_s": session_s,
            "samples_ms": ms, "cpu_samples_ms": cpu_ms,
            "feeds": {k: f"{v.dtype}{list(v.shape)}" for k, v in feed.items()}}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--level", choices=sorted(LEVELS), required=True)
    parser.add_argument("--feeds-from", default="")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.5)
    parser.add_argument("--shape", action="append", default=[])
    parser.add_argument("--unit", action="append", default=[])
    args = parser.parse_args(argv)
    record: dict = {"model": args.model, "level": LEVELS[args.level], "ok": True, "error": "",
                    "loadavg_before": os.getloadavg()[0]}
    try:
        record.update(measure(args))
    except BaseException as err:  # every failure is a result, never a crash of the bench
        text = str(err).strip() or type(err).__name__
        record.update(ok=False, error=f"{type(err).__name__}: {text.splitlines()[0][:300]}",
                      traceback=traceback.format_exc()[-4000:])
    record["loadavg_after"] = os.getloadavg()[0]
    print("BENCH_LATENCY " + json.dumps(record), flush=True)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
