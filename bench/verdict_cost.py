"""What the scale-aware verdict adds to the per-pass check (issue 11).

    python bench/verdict_cost.py [--runs 5]

The new criterion costs two things: the noise floor (the original run once more, with
onnxruntime's BASIC optimizations, when the check is prepared: once per `graphfix run`)
and the per-output measure after each pass (`runtime.compare`). Per model, median over
`--runs` of: preparing the reference run alone, measuring the floor, one comparison of
the outputs, and the whole default pipeline (`trt-prep`) with its check, whose share the
floor is. The two preparations alternate (A B A B) so drift hits both.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import onnx

import graphfix
from graphfix.runtime.compare import compare_outputs
from graphfix.runtime.feeds import graph_inputs, random_feeds, resolve_shapes
from graphfix.runtime.outputs import OutputCheck
from graphfix.runtime.session import run_model
from graphfix.samples import deep_resnet

SHARED = Path(__file__).resolve().parents[2] / "shared" / "models"


def _models() -> dict[str, onnx.ModelProto]:
    found = {"deep_resnet (50 blocks)": deep_resnet(seed=0)}
    path = SHARED / "ssdlite320_mobilenet_v3_large.onnx"
    if path.exists():
        found["ssdlite320_mobilenet_v3_large"] = onnx.load(str(path))
    return found


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(model: onnx.ModelProto, runs: int) -> dict[str, float]:
    inputs = graph_inputs(model)
    feeds = random_feeds(inputs, resolve_shapes(inputs), 0)
    reference, floor, compare, pipeline = [], [], [], []
    for _ in range(runs):
        start = time.perf_counter()
        outputs = run_model(model, feeds)
        reference.append(time.perf_counter() - start)
        check = OutputCheck(feeds, outputs, seed=0)
        floor.append(_time(lambda check=check: check.measure_floor(model)))
        start = time.perf_counter()
        compare_outputs(outputs, outputs, floors=check.floors)
        compare.append(time.perf_counter() - start)
    for _ in range(max(1, runs // 2)):
        pipeline.append(_time(lambda: graphfix.run(model)))
    return {k: statistics.median(v) for k, v in (("reference", reference), ("floor", floor),
                                                  ("compare", compare), ("pipeline", pipeline))}


def main() -> None:
    import onnxruntime

    onnxruntime.set_default_logger_severity(4)  # as the CLI does: graphfix reports errors
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print("| model | reference run | noise floor | one comparison | trt-prep with check "
          "| floor share |")
    print("|---|---|---|---|---|---|")
    for name, model in _models().items():
        t = measure(model, args.runs)
        print(f"| {name} | {t['reference']:.3f} s | {t['floor']:.3f} s | "
              f"{t['compare'] * 1e3:.2f} ms | {t['pipeline']:.2f} s | "
              f"{t['floor'] / t['pipeline']:.1%} |")


if __name__ == "__main__":
    main()
