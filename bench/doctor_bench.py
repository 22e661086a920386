"""How long `graphfix doctor` takes, end to end, on the shared models (issue 4: SSDlite
under 2 s on the development machine).

No peer runs here: polygraphy's `inspect capability` (the tool a user would otherwise
pick) needs TensorRT, which this machine does not have. Each run is a fresh process
(`graphfix doctor MODEL --trt VERSION --json --no-parser`), so interpreter start-up and
imports count; peak RSS is the child's `ru_maxrss`. Prints a Markdown table.

    python bench/doctor_bench.py [--runs 5] [--trt 10.16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODELS = Path(os.environ.get("GRAPHFIX_BENCH_MODELS",
                             Path(__file__).resolve().parents[2] / "shared" / "models"))
NAMES = ("digits_dev.onnx", "mobilenet_v3_small_bn.onnx",
         "ch_ppocr_mobile_v2.0_cls_infer.onnx", "ssdlite320_mobilenet_v3_large.onnx")


def one_run(model: Path, trt: str) -> tuple[float, float, dict]:
    exe = shutil.which("graphfix") or str(Path(sys.executable).with_name("graphfix"))
    start = time.perf_counter()
    proc = subprocess.Popen([exe, "doctor", str(model), "--trt", trt, "--json", "--no-parser"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = proc.stdout.read()  # the JSON; stderr stays small
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)  # reaps the child: its own peak RSS
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"doctor failed on {model}: {err}")
    return wall, usage.ru_maxrss / 1024, json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--trt", default="10.16")
    args = parser.parse_args()
    print(f"| model | e2e median s (of {args.runs}) | e2e min s | diagnosis s | peak MiB | "
          "verdict | findings e/w/i |")
    print("|---|---|---|---|---|---|---|")
    for name in NAMES:
        path = MODELS / name
        if not path.exists():
            continue
        runs = [one_run(path, args.trt) for _ in range(args.runs)]
        walls = [r[0] for r in runs]
        data = runs[-1][2]
        counts = data["counts"]
        print(f"| {name} | {statistics.median(walls):.2f} | {min(walls):.2f} | "
              f"{data['seconds']:.2f} | {max(r[1] for r in runs):.0f} | {data['verdict']} | "
              f"{counts['error']}/{counts['warn']}/{counts['info']} |")


if __name__ == "__main__":
    main()
