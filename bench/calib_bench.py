"""graphfix calibrate vs onnxruntime.quantization's calibrators: wall time and peak memory.

Issue 5's benchmark: mobilenet_v3_small_bn with BatchNormalization folded first (by
graphfix fold-bn, the same FP32 model for both tools), 64 and 256 calibration samples
(seeded uniform [0, 1) images, one .npy file per sample, read lazily by both tools),
methods MinMax, Entropy and Percentile. onnxruntime runs `quantize_static` the way a
TensorRT user would configure it: QDQ format, symmetric INT8 activations and weights,
per-channel weights; its Entropy with 2048 histogram bins and 128 quantized bins (its
default of 128 bins would make the KL search trivial), Percentile 99.99 with 2048 bins.
graphfix runs `graphfix.calibration.runner.calibrate` with the same methods and bins.
Each (tool, method, samples) runs in a fresh process; wall time includes imports;
peak RSS is the child's `ru_maxrss`. Prints a Markdown table; `--results` appends it
to bench/RESULTS.md's analysis section by hand (not automatic).

    python bench/calib_bench.py [--runs 1] [--samples 64,256] [--methods minmax,entropy,percentile]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path(os.environ.get("GRAPHFIX_BENCH_MODELS", ROOT.parent / "shared" / "models")) / \
    "mobilenet_v3_small_bn.onnx"
ORT_METHOD = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}

CHILD = r'''
import sys, time, os
import numpy as np
tool, method, model_path, data_dir, n, out = sys.argv[1:7]
n = int(n)
start = time.perf_counter()
files = sorted(os.listdir(data_dir))[:n]
if tool == "graphfix":
    import onnx
    from graphfix.runtime.data import open_data
    from graphfix.calibration.runner import calibrate
    model = onnx.load(model_path)
    data = open_data(data_dir, model, max_samples=n, batch_size=1)
    result = calibrate(model, data, (method,), fold_bn=False)
    onnx.save(result.outcome().model, out)
else:
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod,
                                          QuantFormat, QuantType, quantize_static)
    import onnx
    name = onnx.load(model_path).graph.input[0].name
    class Reader(CalibrationDataReader):
        def __init__(self):
            self.files = iter(files)
        def get_next(self):
            f = next(self.files, None)
            return None if f is None else {name: np.load(os.path.join(data_dir, f))[None]}
    extra = {"ActivationSymmetric": True, "WeightSymmetric": True}
    if method == "Entropy":
        extra.update(CalibNumBins=2048, CalibNumQuantizedBins=128)
    if method == "Percentile":
        extra.update(CalibNumBins=2048, CalibPercentile=99.99)
    quantize_static(model_path, out, Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    per_channel=True, calibrate_method=getattr(CalibrationMethod, method),
                    extra_options=extra)
print(time.perf_counter() - start)
'''


def prepare(workdir: Path, samples: int) -> tuple[Path, Path]:
    import onnx

    from graphfix.api import run

    folded = workdir / "mobilenet_folded.onnx"
    onnx.save(run(onnx.load(MODEL), passes="fold-bn", check=False).model, folded)
    data = workdir / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(samples):
        np.save(data / f"{i:05d}.npy", rng.random((3, 224, 224), dtype=np.float32))
    return folded, data


def child(tool: str, method: str, model: Path, data: Path, n: int, out: Path
          ) -> tuple[float, float, float]:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, tool, method, str(model), str(data),
                             str(n), str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{tool} {method} {n} failed:\n{stderr[-3000:]}")
    wall = time.perf_counter() - start
    return wall, float(stdout.strip().splitlines()[-1]), usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--samples", default="64,256")
    parser.add_argument("--methods", default="minmax,entropy,percentile")
    args = parser.parse_args()
    counts = [int(s) for s in args.samples.split(",")]
    methods = args.methods.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, data = prepare(work, max(counts))
        rows = []
        for method in methods:
            for n in counts:
                measured = {}
                for tool, name in (("graphfix", method), ("onnxruntime", ORT_METHOD[method])):
                    runs = [child(tool, name, model, data, n, work / f"{tool}.onnx")
                            for _ in range(args.runs)]
                    measured[tool] = (statistics.median(r[0] for r in runs),
                                      max(r[2] for r in runs))
                rows.append((method, n, measured))
    print("| method | samples | graphfix s | onnxruntime s | time ratio | graphfix peak MiB "
          "| onnxruntime peak MiB | peak ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for method, n, m in rows:
        (gt, gm), (ot, om) = m["graphfix"], m["onnxruntime"]
        print(f"| {method} | {n} | {gt:.1f} | {ot:.1f} | {gt / ot:.2f}x | {gm:.0f} | {om:.0f} "
              f"| {gm / om:.2f}x |")
    print()
    for method in methods:
        peaks = {n: m["graphfix"][1] for meth, n, m in rows if meth == method}
        if len(peaks) >= 2:
            low, high = min(peaks), max(peaks)
            print(f"- graphfix {method}: peak RSS {peaks[low]:.0f} MiB at {low} samples, "
                  f"{peaks[high]:.0f} MiB at {high} (+{peaks[high] / peaks[low] - 1:.1%})")


if __name__ == "__main__":
    main()
