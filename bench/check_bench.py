"""graphfix check vs `polygraphy run --onnx-outputs mark all` (issue 6's benchmark).

digits_dev: the FP32 model against its INT8 Q/DQ model from graphfix calibrate (entropy,
the 'calib' samples), on the first S 'test' samples of digits_dev_data.npz, batch 1.
graphfix: `graphfix check FP32 INT8 --data ... --samples S --json -` (runs both models,
every shared tensor, every sample, origins). polygraphy, what a user does today:
`polygraphy run FP32 --onnxrt --onnx-outputs mark all` on the same inputs (a data-loader
script), which runs only the reference and compares nothing. Each measurement is a fresh
process (imports count), the two tools alternating; the median of --runs is shown with
the ratio. Prints Markdown.

    python bench/check_bench.py [--runs 3] [--samples 1,16]
    python bench/check_bench.py --comparator [--batch 8] [--iterations 16]

--comparator: why graphfix check does not run through polygraphy's Comparator. Both
tools compare a model with itself, every tensor, on the same number of samples:
`graphfix check M M` against `polygraphy run M --onnxrt --onnxrt --onnx-outputs mark
all` (two runners, so Comparator.run keeps every output of every iteration and
compare_accuracy compares them). M is mobilenet_v3_small_bn at --batch; wall time and
the child's peak RSS (os.wait4), one run each.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("GRAPHFIX_BENCH_MODELS", ROOT.parent / "shared" / "models"))

LOADER = '''
import numpy as np
def load_data():
    data = np.load({path!r})["test"]
    for i in range({count}):
        yield {{"input": data[i:i + 1]}}
'''


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path(sys.executable).with_name(name))


def prepare(work: Path) -> tuple[Path, Path, Path]:
    import onnx

    from graphfix.calibration.runner import calibrate
    from graphfix.runtime.data import open_data

    fp32_src, data = MODELS / "digits_dev.onnx", MODELS / "digits_dev_data.npz"
    model = onnx.load(fp32_src)
    result = calibrate(model, open_data(data, model, data_key="calib", batch_size=50),
                       ("entropy",))
    fp32, int8 = work / "fp32.onnx", work / "int8.onnx"
    onnx.save(result.fp32, fp32)
    onnx.save(result.outcome().model, int8)
    return fp32, int8, data


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def measured(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one run of `cmd`."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"{cmd[0]} failed:\n{stderr[-2000:]}")
    return time.perf_counter() - start, usage.ru_maxrss / 1024


def comparator(batch: int, iterations: int) -> None:
    model = MODELS / "mobilenet_v3_small_bn.onnx"
    ours = [_exe("graphfix"), "check", str(model), str(model), "--samples", str(iterations),
            "--input-shape", f"input:{batch}x3x224x224"]
    theirs = [_exe("polygraphy"), "run", str(model), "--onnxrt", "--onnxrt", "--onnx-outputs",
              "mark", "all", "--iterations", str(iterations),
              "--input-shapes", f"input:[{batch},3,224,224]"]
    (gw, gm), (pw, pm) = measured(ours), measured(theirs)
    print(f"mobilenet_v3_small_bn, batch {batch}, {iterations} samples, every tensor:\n")
    print("| tool | wall s | peak RSS MiB |")
    print("|---|---|---|")
    print(f"| graphfix check M M | {gw:.1f} | {gm:.0f} |")
    print(f"| polygraphy run M --onnxrt --onnxrt (Comparator) | {pw:.1f} | {pm:.0f} |")
    print(f"| ratio graphfix / polygraphy | {gw / pw:.2f}x | {gm / pm:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--samples", default="1,16")
    parser.add_argument("--comparator", action="store_true")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=16)
    args = parser.parse_args()
    if args.comparator:
        comparator(args.batch, args.iterations)
        return
    print("| samples | graphfix check s | polygraphy run s | ratio |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fp32, int8, data = prepare(work)
        for count in (int(s) for s in args.samples.split(",")):
            loader = work / f"loader_{count}.py"
            loader.write_text(LOADER.format(path=str(data), count=count))
            ours = [_exe("graphfix"), "check", str(fp32), str(int8), "--data", str(data),
                    "--data-key", "test", "--samples", str(count), "--json", "-"]
            theirs = [_exe("polygraphy"), "run", str(fp32), "--onnxrt", "--onnx-outputs",
                      "mark", "all", "--data-loader-script", f"{loader}:load_data"]
            pairs = [(timed(ours), timed(theirs)) for _ in range(args.runs)]  # interleaved:
            g = statistics.median(a for a, _ in pairs)  # load changes hit both alike
            p = statistics.median(b for _, b in pairs)
            print(f"| {count} | {g:.2f} | {p:.2f} | {g / p:.2f}x |")


if __name__ == "__main__":
    main()
