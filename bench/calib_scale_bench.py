"""Calibration at scale: `graphfix calibrate` vs onnxruntime's MinMax, wall time and peak RSS.

Issue 13's benchmark. The claim it measures: calibrating a ResNet-50-class model on 256
and 1024 samples keeps peak memory independent of the sample count (within 10%) and
takes no more than 1.1x the time of onnxruntime's MinMax calibration on the same data.

Data: seeded (`--seed`) standard-normal float32 samples, shaped like the model's single
input without its batch axis, written once per sample count into `--workdir` in two
forms: `npy{N}/` (one sample per .npy file) and `data{N}.npz` (`np.savez`, key = the
input's name, all N samples stacked). Sample i is the same in every form and count.

Runs, each in a fresh process, so peak RSS (`ru_maxrss` from `os.wait4`) is per run; wall
time is taken inside that process from its first statement, so imports and writing the
output model count, interpreter start-up does not (the same for every tool):

- `graphfix`: the CLI as a user runs it, `python -m graphfix calibrate MODEL --data npy{N}
  -o OUT --json` (its default method; run through `runpy` so the clock starts before
  graphfix is imported); its stdout must parse as JSON.
- `graphfix (.npz)`: the same with `--data data{N}.npz`.
- `onnxruntime MinMax`: `quantize_static` set up as a TensorRT user would (QDQ, QInt8
  activations and weights, per-channel weights, MinMax, symmetric activations and
  weights), fed by a `CalibrationDataReader` that loads one .npy per `get_next`.

Per sample count the order is graphfix, onnxruntime, graphfix (.npz), onnxruntime,
repeated `--runs` times, so drift hits both tools; each cell is the median of its runs.
Before that, every variant runs once untimed on a few samples (`--warmup`), so .pyc files
(written under the work dir, as bench/run_bench.py does) and the page cache are warm.
Prints a Markdown table and the setup (commands, versions, CPU) to paste into RESULTS.md.

    python bench/calib_scale_bench.py [--model resnet50.onnx] [--samples 256,1024] [--runs 1]
"""

import time

T_START = time.perf_counter()  # a child's clock starts here, before any other import

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import datetime  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = os.environ.get("GRAPHFIX_BENCH_RESNET50", "/work/zoo/calib/resnet50.onnx")
GRAPHFIX, GRAPHFIX_NPZ, ORT = "graphfix", "graphfix (.npz)", "onnxruntime MinMax"
TOOLS = (GRAPHFIX, GRAPHFIX_NPZ, ORT)
ORT_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
ORT_CALL = ("quantize_static(MODEL, OUT, reader, quant_format=QuantFormat.QDQ, "
            "activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True, "
            "calibrate_method=CalibrationMethod.MinMax, "
            "extra_options={'ActivationSymmetric': True, 'WeightSymmetric': True})")
EXPORT_HOWTO = """\
Export a ResNet-50 with random weights (needs torch and torchvision):

    python -c "import torch, torchvision; torch.onnx.export(
        torchvision.models.resnet50(weights=None).eval(), torch.randn(1, 3, 224, 224),
        'resnet50.onnx', input_names=['input'], output_names=['logits'],
        opset_version=17, dynamic_axes={'input': {0: 'N'}})"

then pass --model resnet50.onnx (or set GRAPHFIX_BENCH_RESNET50)."""


# ---------------------------------------------------------------- child side

def _ort_calibrate(model: str, data_dir: str, out: str, input_name: str, providers: str
                   ) -> None:
    import numpy as np
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.files = iter(sorted(f for f in os.listdir(data_dir) if f.endswith(".npy")))

        def get_next(self) -> dict | None:
            name = next(self.files, None)
            return None if name is None else {input_name: np.load(os.path.join(data_dir,
                                                                               name))[None]}

    quantize_static(model, out, Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    per_channel=True, calibrate_method=CalibrationMethod.MinMax,
                    calibration_providers=[ORT_PROVIDERS[p] for p in providers.split(",")],
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})


def child_main(argv: list[str]) -> int:
    """`_child TIMING_FILE graphfix CLI_ARGS...` or
    `_child TIMING_FILE ort MODEL DIR OUT NAME PROVIDERS`."""
    timing_file, tool, rest = argv[0], argv[1], argv[2:]
    rc = 0
    if tool == "graphfix":
        import runpy

        sys.path[0] = os.getcwd()  # as `python -m` has it, not bench/
        sys.argv = ["graphfix", *rest]
        try:
            runpy.run_module("graphfix", run_name="__main__", alter_sys=True)
        except SystemExit as done:
            rc = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    else:
        _ort_calibrate(*rest)
    sys.stdout.flush()
    Path(timing_file).write_text(json.dumps({"wall_s": time.perf_counter() - T_START}))
    return rc


# ---------------------------------------------------------------- parent side

@dataclass
class Run:
    tool: str
    samples: int
    wall_s: float = float("nan")     # inside the child
    process_s: float = float("nan")  # spawn to exit, measured by the parent
    peak_mib: float = float("nan")
    error: str = ""
    notes: dict = field(default_factory=dict)


def model_input(path: Path) -> tuple[str, tuple[int, ...]]:
    """The single input's name and its shape without the batch axis; exits 2 if unsuitable."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    if len(inputs) != 1 or inputs[0].type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        raise SystemExit(f"{path}: needs exactly one float32 input, it has "
                         f"{[(i.name, i.type.tensor_type.elem_type) for i in inputs]}")
    dims = inputs[0].type.tensor_type.shape.dim
    batch, rest = dims[0], dims[1:]
    if (batch.HasField("dim_value") and batch.dim_value != 1) or not all(
            d.HasField("dim_value") and d.dim_value > 0 for d in rest):
        raise SystemExit(f"{path}: input '{inputs[0].name}' must be [N or 1, static dims...], "
                         f"it is {[d.dim_param or d.dim_value for d in dims]}")
    return inputs[0].name, tuple(d.dim_value for d in rest)


def _folder_ok(folder: Path, n: int) -> bool:
    return folder.is_dir() and sum(1 for f in folder.iterdir() if f.suffix == ".npy") == n


def _npz_ok(npz: Path, key: str) -> bool:
    import zipfile

    try:
        with zipfile.ZipFile(npz) as z:
            return f"{key}.npy" in z.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def prepare_data(workdir: Path, name: str, shape: tuple[int, ...], n: int, seed: int
                 ) -> tuple[Path, Path]:
    """`npy{n}/` and `data{n}.npz`, reused when already there; written under temp names."""
    import numpy as np

    folder, npz = workdir / f"npy{n}", workdir / f"data{n}.npz"
    if _folder_ok(folder, n) and _npz_ok(npz, name):
        return folder, npz
    print(f"writing {n} samples to {folder} and {npz}", file=sys.stderr)
    tmp_dir, tmp_npy, tmp_npz = (workdir / f".npy{n}.tmp", workdir / f".stack{n}.tmp.npy",
                                 workdir / f".data{n}.tmp.npz")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    stack = np.lib.format.open_memmap(tmp_npy, mode="w+", dtype=np.float32, shape=(n, *shape))
    rng, width = np.random.default_rng(seed), max(5, len(str(n - 1)))
    for i in range(n):
        stack[i] = rng.standard_normal(shape, dtype=np.float32)
        np.save(tmp_dir / f"{i:0{width}d}.npy", stack[i])
    np.savez(tmp_npz, **{name: stack})
    del stack
    tmp_npy.unlink()
    shutil.rmtree(folder, ignore_errors=True)
    tmp_dir.rename(folder)
    tmp_npz.replace(npz)
    return folder, npz


def graphfix_args(model: Path, data: Path, out: Path, providers: str) -> list[str]:
    return ["calibrate", str(model), "--data", str(data), "-o", str(out), "--json",
            *(["--providers", providers] if providers != "cpu" else [])]


def run_child(tool: str, n: int, model: Path, data: tuple[Path, Path], input_name: str,
              workdir: Path, env: dict, timeout: float, providers: str) -> Run:
    """One run in a fresh process; a failure is recorded in `Run.error`, never raised."""
    tag = f"{tool.split()[0]}{'-npz' if tool == GRAPHFIX_NPZ else ''}-{n}"
    out, timing = workdir / "out" / f"{tag}.onnx", workdir / "out" / f"{tag}.time.json"
    out.parent.mkdir(exist_ok=True)
    for f in (out, timing):
        f.unlink(missing_ok=True)
    if tool == ORT:
        args = ["ort", str(model), str(data[0]), str(out), input_name, providers]
    else:
        args = ["graphfix", *graphfix_args(model, data[tool == GRAPHFIX_NPZ], out, providers)]
    run = Run(tool, n)
    with open(workdir / "out" / "stdout", "w+") as so, open(workdir / "out" / "stderr", "w+") as se:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "_child",
                                 str(timing), *args], stdout=so, stderr=se, env=env,
                                cwd=ROOT, start_new_session=True)
        killer = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
        killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # Ctrl-C: the child is in its own session, so end it too
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            killer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        run.process_s, run.peak_mib = time.perf_counter() - start, usage.ru_maxrss / 1024
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read(), se.read()
    if proc.returncode != 0:
        lines = stderr.strip().splitlines() or ["(no stderr)"]
        last = next((line for line in reversed(lines)  # the exception, if a traceback shows one
                     if re.match(r"[A-Za-z_][\w.]*(Error|Exception)\b", line)), lines[-1])
        run.error = (f"killed after {timeout:.0f} s (--timeout)" if proc.returncode == -9
                     else f"exit {proc.returncode}: {last[:160]}")
        print(f"--- {tool} n={n} failed; stderr tail:\n{stderr[-3000:]}", file=sys.stderr)
    elif not out.is_file() or out.stat().st_size == 0:
        run.error = "no output model written"
    elif tool != ORT:
        try:
            run.notes["json"] = summary = json.loads(stdout)
            if isinstance(summary, dict):  # optional: the JSON's shape is not relied on
                method = summary.get("method", summary.get("recommended"))
                if isinstance(method, str):
                    run.notes["method"] = method
        except json.JSONDecodeError as err:
            run.error = f"stdout is not JSON ({err})"
    if timing.is_file():
        run.wall_s = json.loads(timing.read_text())["wall_s"]
    out.unlink(missing_ok=True)
    return run


def machine() -> list[str]:
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    cpu, flags = "unknown", ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and cpu == "unknown":
                cpu = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value
    import onnxruntime as ort  # the one that runs: onnxruntime-gpu has another dist name

    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() if shutil.which(
                             "nvidia-smi") else ""
    mem_kib = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("MemTotal:")), 0)
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                         capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "src"], cwd=ROOT,
                           capture_output=True).returncode == 1
    return [
        f"date: {datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"graphfix {version('graphfix')} (commit {git}"
        f"{', with uncommitted changes in src/' if dirty else ''}), onnxruntime "
        f"{ort.__version__} ({', '.join(ort.get_available_providers())}), onnx "
        f"{version('onnx')}, numpy {version('numpy')}, "
        f"python {platform.python_version()}",
        f"CPU: {cpu}, avx512f {'yes' if 'avx512f' in flags.split() else 'no'}, "
        f"{os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), "
        f"{mem_kib / 2**20:.1f} GiB RAM" + (f"; GPU: {gpu}" if gpu else ""),
    ]


def _f(value: float, spec: str, suffix: str = "") -> str:
    return "n/a" if value != value else f"{value:{spec}}{suffix}"  # NaN: no successful run


def _median(runs: list[Run], attr: str) -> float:
    ok = [getattr(r, attr) for r in runs if not r.error]
    return statistics.median(ok) if ok else float("nan")


def report(runs: list[Run], counts: list[int], args: argparse.Namespace, model: Path,
           workdir: Path) -> str:
    lines = ["| samples | tool | wall s | peak MiB | time ratio vs onnxruntime MinMax |",
             "|---:|---|---:|---:|---:|"]
    cell: dict[tuple[str, int], tuple[float, float, list[Run]]] = {}
    for n in counts:
        for tool in TOOLS:
            mine = [r for r in runs if r.tool == tool and r.samples == n]
            cell[tool, n] = (_median(mine, "wall_s"), _median(mine, "peak_mib"), mine)
        ort_wall = cell[ORT, n][0]
        for tool in TOOLS:
            wall, peak, mine = cell[tool, n]
            bad = sum(1 for r in mine if r.error)
            failed = f" ({bad} of {len(mine)} runs failed, see below)" if bad else ""
            ratio = wall / ort_wall if wall == wall and ort_wall == ort_wall else float("nan")
            lines.append(f"| {n} | {tool}{failed} | {_f(wall, '.1f')} | {_f(peak, '.0f')} "
                         f"| {_f(ratio, '.2f', 'x')} |")
    lo, hi = min(counts), max(counts)
    lines += ["", f"Peak change from {lo} to {hi} samples (claim: within ±10%), and time "
              "ratio (claim: at most 1.1x):", ""]
    for tool in TOOLS:
        change = cell[tool, hi][1] / cell[tool, lo][1] - 1
        verdict = "" if change != change or tool == ORT else \
            f" ({'within' if abs(change) <= 0.10 else 'NOT within'} ±10%)"
        ratios = "" if tool == ORT else ", time ratio " + ", ".join(
            f"{_f(cell[tool, n][0] / cell[ORT, n][0], '.2f', 'x')} at {n}" for n in counts)
        lines.append(f"- {tool}: peak {_f(cell[tool, lo][1], '.0f')} -> "
                     f"{_f(cell[tool, hi][1], '.0f')} MiB, {_f(change, '+.1%')}{verdict}{ratios}")
    failures = sorted({f"{r.samples} {r.tool}: {r.error}" for r in runs if r.error})
    if failures:
        lines += ["", "Failed runs:", ""] + [f"- {f}" for f in failures]
    methods = sorted({r.notes["method"] for r in runs if "method" in r.notes})
    lines += ["", f"Runs per cell: {args.runs} (medians; onnxruntime ran twice per round, once "
              "after each graphfix variant). Per run, wall s / peak MiB / process s:", ""]
    for n in counts:
        for tool in TOOLS:
            lines.append(f"- {n} {tool}: " + ", ".join(
                f"{r.wall_s:.1f} / {r.peak_mib:.0f} / {r.process_s:.1f}" for r in cell[tool, n][2]))
    data = f"{workdir}/npy{{N}}"
    lines += ["", "Commands:", "", "```",
              "python bench/calib_scale_bench.py " + " ".join(sys.argv[1:]),
              "# graphfix, per sample count N (method: its default"
              + (f"; its JSON says {', '.join(methods)})" if methods else ")"),
              "python -m graphfix " + " ".join(graphfix_args(model, Path(data), Path("out.onnx"),
                                                             args.providers)),
              "python -m graphfix " + " ".join(graphfix_args(
                  model, Path(f"{workdir}/data{{N}}.npz"), Path("out.onnx"), args.providers)),
              f"# onnxruntime, reader = one np.load({data}/*.npy)[None] per get_next",
              ORT_CALL.replace("extra_options", "calibration_providers="
                               f"{[ORT_PROVIDERS[p] for p in args.providers.split(',')]}, "
                               "extra_options"), "```", "",
              f"Model: {model}. Data: standard normal float32, seed {args.seed}, batch 1. "
              "Wall s: inside the child process, from before its imports to after the output "
              "model is written; peak MiB: the child's ru_maxrss.", ""]
    return "\n".join(lines + machine())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path(DEFAULT_MODEL),
                        help="single-input float32 image classifier, input [N or 1, C, H, W] "
                        "(default: $GRAPHFIX_BENCH_RESNET50, else %(default)s)")
    parser.add_argument("--samples", default="256,1024",
                        help="comma-separated sample counts; the peak change is taken from the "
                        "smallest to the largest (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=1,
                        help="rounds per sample count; each cell is the median (default: 1)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the samples (npy{N}/, data{N}.npz), .pyc files and outputs "
                        "go; existing samples there are reused, and it is kept. Default: a "
                        "temp dir, removed at the end (1024 ResNet-50 samples take ~1.2 GB "
                        "there in both forms)")
    parser.add_argument("--seed", type=int, default=0, help="numpy seed of the samples "
                        "(default: 0; with a reused --workdir, the seed its samples had)")
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                        help="one untimed run per tool on min(8, smallest count) samples first, "
                        "to compile .pyc files and warm the page cache (default: on)")
    parser.add_argument("--timeout", type=float, default=7200,
                        help="seconds before a run is killed and recorded as failed "
                        "(default: %(default)s)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the default temp work dir (its path is printed)")
    parser.add_argument("--json", type=Path, default=None, help="also write every run as JSON")
    parser.add_argument("--providers", default="cpu", choices=["cpu", "cuda,cpu"],
                        help="onnxruntime providers of both tools: graphfix --providers, "
                        "onnxruntime's calibration_providers (default: %(default)s)")
    args = parser.parse_args()
    counts = sorted({int(s) for s in args.samples.split(",") if s.strip()})
    if not counts or counts[0] < 1 or args.runs < 1:
        parser.error("--samples needs counts >= 1 and --runs >= 1")
    if not args.model.is_file():
        print(f"error: model {args.model} not found.\n{EXPORT_HOWTO}", file=sys.stderr)
        return 2
    model = args.model.resolve()
    name, shape = model_input(model)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="graphfix-calib-scale-"))
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
    runs: list[Run] = []
    try:
        data = {n: prepare_data(workdir, name, shape, n, args.seed) for n in counts}
        if args.warmup:
            w = min(8, counts[0])
            wdata = data.get(w) or prepare_data(workdir, name, shape, w, args.seed)
            for tool in TOOLS:
                r = run_child(tool, w, model, wdata, name, workdir, env, args.timeout,
                              args.providers)
                print(f"warm-up {tool} n={w}: {r.error or f'{r.wall_s:.1f} s'}", file=sys.stderr)
        order = [GRAPHFIX, ORT, GRAPHFIX_NPZ, ORT]
        for n in counts:
            for i in range(args.runs):
                for tool in order:
                    r = run_child(tool, n, model, data[n], name, workdir, env, args.timeout,
                                  args.providers)
                    runs.append(r)
                    print(f"n={n} round {i + 1} {tool}: {r.wall_s:.1f} s, {r.peak_mib:.0f} MiB"
                          f"{' FAILED ' + r.error if r.error else ''}", file=sys.stderr)
        print(report(runs, counts, args, model, workdir))
        if args.json:
            args.json.write_text(json.dumps([r.__dict__ for r in runs], indent=1))
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.workdir is None:
            print(f"work dir kept: {workdir}", file=sys.stderr)
    return 1 if any(r.error for r in runs) else 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[2:]) if sys.argv[1:2] == ["_child"] else main())
