"""The zoo's measure of the tools' outputs for one model, in a fresh process.

    python bench/zoo_eval.py SPEC.json

SPEC: {"model": path, "shapes": {input: dims}, "outputs": {label: path}}. For the
original and every output: nodes (subgraphs included, `evaluate.op_counts`), whether
`onnx.checker` accepts it, and the ops that the newest TensorRT operator table graphfix
ships rejects (graphfix doctor's error findings; a model-wide error without an op is
listed by its rule id in brackets). For every output, against the original: each graph
output's scale-relative max error, max |c - r| / max |r|, and SQNR in dB
(`graphfix.runtime.measure`, the measure graphfix's own check uses), the worst over
the outputs. Every model runs in onnxruntime on CPU with graph optimizations disabled,
on the same seeded inputs (`graphfix.runtime.feeds.model_feeds`, seed 0: standard
normal floats, state inputs zeros, a scalar sample rate the constant the graph compares
it with). Outputs are matched by name, else by position. Prints `BENCH_EVAL {json}`;
one bad output is recorded, never fatal.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import onnx
from evaluate import error_line, op_counts, run  # bench/ is sys.path[0]

from graphfix.doctor import ERROR, diagnose
from graphfix.runtime.feeds import graph_inputs, model_feeds, resolve_shapes
from graphfix.runtime.measure import measure
from graphfix.trt import documented_versions, parse_target


def structure(path: str, target) -> dict:
    """Nodes, BatchNormalization left, checker verdict and TensorRT-rejected ops."""
    model = onnx.load(path)
    ops = op_counts(model.graph)
    try:
        onnx.checker.check_model(path)
        checker = "ok"
    except Exception as err:  # the verdict is data here
        checker = error_line(err)
    errors = diagnose(model, target).by_severity(ERROR)
    rejected = sorted({f.op or f"[{f.rule}]" for f in errors})
    return {"nodes": sum(ops.values()), "bn": ops["BatchNormalization"],
            "checker": checker, "trt_rejected": rejected, "ops": dict(ops.most_common())}


def compare(reference: tuple[list[str], list[np.ndarray]],
            candidate: tuple[list[str], list[np.ndarray]]) -> dict:
    """The worst scale-relative error and SQNR over the graph outputs."""
    ref_names, ref_values = reference
    got_names, got_values = candidate
    if len(got_values) != len(ref_values):
        return {"problem": f"{len(got_values)} outputs, the original has {len(ref_values)}"}
    by_name = dict(zip(got_names, got_values, strict=True))
    if set(by_name) != set(ref_names):
        by_name = dict(zip(ref_names, got_values, strict=True))  # renamed: by position
    worst = {"rel_err": 0.0, "sqnr_db": math.inf, "problem": ""}
    for name, expected in zip(ref_names, ref_values, strict=True):
        m = measure(np.asarray(expected), np.asarray(by_name[name]))
        if isinstance(m, str) or m.problem:
            return {"problem": f"output {name}: {m if isinstance(m, str) else m.problem}"}
        worst["rel_err"] = max(worst["rel_err"], m.error)
        worst["sqnr_db"] = min(worst["sqnr_db"], m.sqnr_db)
    worst["empty"] = [n for n, v in zip(ref_names, ref_values, strict=True) if v.size == 0]
    return worst


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    target = parse_target(documented_versions()[-1])
    original = onnx.load(spec["model"], load_external_data=False)
    shapes = resolve_shapes(graph_inputs(original),
                            {k: tuple(v) for k, v in spec.get("shapes", {}).items()})
    feeds = model_feeds(original, shapes)
    del original
    result: dict = {"trt": target.label(), "original": structure(spec["model"], target),
                    "feeds": {k: f"{v.dtype}{list(v.shape)}" for k, v in feeds.items()},
                    "outputs": {}}
    try:
        reference = run(spec["model"], feeds)
    except Exception as err:  # the original itself cannot run: structure only
        reference, result["reference_error"] = None, error_line(err)
    for label, path in spec["outputs"].items():
        entry: dict = {}
        try:
            entry.update(structure(path, target))
            if reference is not None:
                entry.update(compare(reference, run(path, feeds)))
        except Exception as err:  # one bad output must not lose the others
            entry["error"] = error_line(err)
        result["outputs"][label] = entry
    print("BENCH_EVAL " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
