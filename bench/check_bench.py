"""graphfix check vs `polygraphy run --onnx-outputs mark all` (issue 6's benchmark).

digits_dev: the FP32 model against its INT8 Q/DQ model from graphfix calibrate (entropy,
the 'calib' samples), on the first S 'test' samples of digits_dev_data.npz, batch 1.
graphfix: `graphfix check FP32 INT8 --data ... --samples S --json -` (runs both models,
every shared tensor, every sample, origins). polygraphy, what a user does today:
`polygraphy run FP32 --onnxrt --onnx-outputs mark all` on the same inputs (a data-loader
script), which runs only the reference and compares nothing. Each measurement is a fresh
process (imports count); the median of --runs is shown with the ratio. Prints Markdown.

    python bench/check_bench.py [--runs 3] [--samples 1,16]
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

    from graphfix.calibration.data import open_data
    from graphfix.calibration.runner import calibrate

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--samples", default="1,16")
    args = parser.parse_args()
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
            g = statistics.median(timed(ours) for _ in range(args.runs))
            p = statistics.median(timed(theirs) for _ in range(args.runs))
            print(f"| {count} | {g:.2f} | {p:.2f} | {g / p:.2f}x |")


if __name__ == "__main__":
    main()
