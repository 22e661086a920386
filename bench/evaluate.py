"""Structure and numerics of the tools' outputs for one model, in a fresh process.

    python bench/evaluate.py SPEC.json

SPEC: {"model": path, "shapes": {input: dims}, "unit_inputs": [input names drawn
from [0, 1)], "outputs": {tool: path}}. For the original and every output: nodes
(subgraphs included), BatchNormalization / Identity / Constant nodes left, Conv nodes
whose output goes only into an Add or Mul by a constant (`conv_affine`: a bias or scale
not folded into the Conv, which keeps TensorRT from fusing Conv->bias->activation), and the
largest absolute difference of any graph output from the original's, all run in
onnxruntime on CPU with graph optimizations disabled, on the same seeded inputs
(np.random.default_rng(0); dynamic batch dims 1; standard normal, or [0, 1) for the
`unit_inputs`). Outputs are matched by name, else by position. Prints
`BENCH_EVAL {json}`; one bad output is recorded, never fatal.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort


def op_counts(graph: onnx.GraphProto, counts: Counter | None = None) -> Counter:
    """Op types of the graph's nodes and of every subgraph's (If/Loop/Scan bodies)."""
    counts = Counter() if counts is None else counts
    for node in graph.node:
        counts[node.op_type] += 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                op_counts(attr.g, counts)
            for sub in attr.graphs:
                op_counts(sub, counts)
    return counts


def conv_affine(graph: onnx.GraphProto) -> dict[str, int]:
    """Conv nodes whose only consumer is an Add / Mul whose other input is a constant
    (an initializer or a Constant node's output of the same graph), subgraphs included."""
    found = {"Add": 0, "Mul": 0}
    constants = {t.name for t in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in set(node.input):
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    for node in graph.node:
        if node.op_type != "Conv" or not node.output or node.output[0] in outputs:
            continue
        users = consumers.get(node.output[0], [])
        if len(users) == 1 and users[0].op_type in found and len(users[0].input) == 2:
            other = [i for i in users[0].input if i != node.output[0]]
            if other and other[0] in constants:
                found[users[0].op_type] += 1
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                for op, n in conv_affine(sub).items():
                    found[op] += n
    return found


def make_feeds(model: onnx.ModelProto, shapes: dict, unit: set[str]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        if value.name in shapes:
            dims = [int(d) for d in shapes[value.name]]
        else:
            dims = [d.dim_value if d.dim_value > 0 else (1 if i == 0 else -1)
                    for i, d in enumerate(tensor.shape.dim)]
            if -1 in dims:
                raise ValueError(f"input {value.name!r} has a dynamic non-batch dim; "
                                 "give its shape")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if np.issubdtype(dtype, np.floating):
            data = rng.random(dims) if value.name in unit else rng.standard_normal(dims)
        elif np.issubdtype(dtype, np.integer):
            data = rng.integers(0, 10, dims)
        else:
            data = rng.random(dims) > 0.5
        feeds[value.name] = np.asarray(data).astype(dtype)
    return feeds


def run(path: str, feeds: dict[str, np.ndarray]) -> tuple[list[str], list[np.ndarray]]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    return names, session.run(None, {k: v for k, v in feeds.items() if k in wanted})


def max_abs_diff(ref: tuple[list[str], list[np.ndarray]],
                 got: tuple[list[str], list[np.ndarray]]) -> tuple[float | None, str]:
    ref_names, ref_values = ref
    got_names, got_values = got
    if len(got_values) != len(ref_values):
        return None, f"{len(got_values)} outputs, the original has {len(ref_values)}"
    by_name = dict(zip(got_names, got_values, strict=True))
    if set(by_name) != set(ref_names):
        by_name = dict(zip(ref_names, got_values, strict=True))  # renamed: by position
    worst, notes = 0.0, []
    for name, expected in zip(ref_names, ref_values, strict=True):
        actual = by_name[name]
        if actual.shape != expected.shape:
            return None, f"output {name!r} has shape {actual.shape}, expected {expected.shape}"
        if expected.size == 0:
            notes.append(f"{name} empty")
            continue
        diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
        worst = max(worst, float(np.nanmax(diff)) if diff.size else 0.0)
        if np.isnan(actual).any() != np.isnan(expected).any():
            notes.append(f"{name}: NaN pattern differs")
    return worst, "; ".join(notes)


def describe(path: str) -> dict:
    model = onnx.load(path)
    ops = op_counts(model.graph)
    affine = conv_affine(model.graph)
    return {"nodes": sum(ops.values()), "bn": ops["BatchNormalization"],
            "identity": ops["Identity"], "constant": ops["Constant"],
            "conv_add": affine["Add"], "conv_mul": affine["Mul"],
            "ops": dict(ops.most_common())}


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    result: dict = {"original": describe(spec["model"]), "tools": {}}
    feeds = make_feeds(onnx.load(spec["model"]), spec.get("shapes", {}),
                       set(spec.get("unit_inputs", [])))
    result["feeds"] = {k: f"{v.dtype}{list(v.shape)}" for k, v in feeds.items()}
    try:
        reference = run(spec["model"], feeds)
        result["reference_shapes"] = {n: list(v.shape) for n, v in zip(*reference, strict=True)}
    except Exception as err:  # the original itself cannot run: structure only
        reference, result["reference_error"] = None, error_line(err)
    for tool, path in spec["outputs"].items():
        entry: dict = {}
        try:
            entry.update(describe(path))
            if reference is not None:
                entry["max_abs"], entry["note"] = max_abs_diff(reference, run(path, feeds))
        except Exception as err:  # one bad output must not lose the others
            entry["error"] = error_line(err)
        result["tools"][tool] = entry
    print("BENCH_EVAL " + json.dumps(result), flush=True)
    return 0


def error_line(err: Exception) -> str:
    """An exception as one line of at most 300 characters, its type first."""
    text = str(err).strip() or type(err).__name__
    return f"{type(err).__name__}: {text.splitlines()[0][:300]}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
