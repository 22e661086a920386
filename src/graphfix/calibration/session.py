"""What `graphfix calibrate` does between reading its options and printing: data and
evaluation sets, the run, the files written, the summary. The CLI stays thin; this
module never prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from graphfix.calibration import cache as cache_format
from graphfix.calibration import clipping, methods, qdq
from graphfix.calibration.runner import CalibrationResult, Request, calibrate, planned
from graphfix.errors import GraphfixError
from graphfix.runtime.data import CalibrationData, Preprocess, open_data

if TYPE_CHECKING:
    from graphfix.writeset import WriteSet

SCHEMA = "graphfix.calibrate/2"
DEFAULT_CACHE_TRT = "10.16"  # the newest documented TensorRT with implicit INT8 calibration
MIN_BINS, MAX_BINS = 128, 16384


@dataclass
class Options:
    """The command's options. Making one checks the methods and their option values
    (`runner.Request`), so a bad --method or --percentile fails before any work."""

    method: str = methods.DEFAULT
    method_options: dict[str, float] = field(default_factory=dict)  # flag -> value
    per_tensor: bool = False
    exclude_nodes: list[str] = field(default_factory=list)
    exclude_op_types: list[str] = field(default_factory=list)
    bins: int = 2048
    memory_budget: int | None = None
    trt: str | None = None
    providers: tuple[str, ...] = ("cpu",)
    request: Request = field(init=False)

    def __post_init__(self) -> None:
        self.request = Request.make(self.method, self.method_options, self.per_tensor)
        if not MIN_BINS <= self.bins <= MAX_BINS:
            raise GraphfixError(f"--bins {self.bins} is out of range",
                                f"the histogram needs {MIN_BINS} to {MAX_BINS} bins (entropy "
                                f"searches from bin 128; the fine grid grows with bins)",
                                "leave --bins at 2048 unless you know why")


@dataclass
class Loaded:
    calib: CalibrationData
    eval: CalibrationData | None
    labels: np.ndarray | None
    notes: list[str] = field(default_factory=list)


def load_data(model, data, data_key, preprocess, loader_script, max_samples, batch_size,
              eval_split, eval_data, eval_key, labels_key, evaluate) -> Loaded:
    """The calibration set, the held-apart evaluation set (--eval-split or --eval-data;
    10% of --data when an evaluation is wanted and neither is given), and labels."""
    spec = Preprocess.parse(preprocess) if preprocess else None
    calib = open_data(data, model, data_key=data_key, preprocess=spec,
                      loader_script=loader_script, max_samples=max_samples,
                      batch_size=batch_size)
    notes: list[str] = []
    held: CalibrationData | None = None
    if eval_data is not None:
        images = spec if spec is not None and Path(eval_data).is_dir() else None
        held = open_data(eval_data, model, data_key=eval_key, preprocess=images,
                         batch_size=batch_size)
    elif eval_split or evaluate:
        count = eval_split or max(1, calib.num_samples // 10)
        if count >= calib.num_samples:
            raise GraphfixError(
                f"--eval-split {count} leaves no calibration samples",
                f"--data has {calib.num_samples} samples",
                "hold apart fewer samples, or give --eval-data",
            )
        calib, held = calib.split(count)
        notes.append(f"the last {count} samples are held apart for the comparison")
    labels = None
    if labels_key == FOLDER_LABELS:
        labels = held.folder_labels() if held is not None else None
        if labels is None:
            raise GraphfixError(
                f"--labels {FOLDER_LABELS} needs class subfolders",
                "the labels are the class folders' indices (sorted names), so the compared "
                "samples must come from an image folder laid out as FOLDER/CLASS/*.jpg",
                "point --eval-data (or --data with --eval-split) at such a folder, or give "
                "the labels as an .npz array")
    elif labels_key:
        labels = _labels(eval_data or data, labels_key, held)
    return Loaded(calib, held, labels, notes)


FOLDER_LABELS = "folders"
"""--labels' value for an image folder of class subfolders: each image's label is its
folder's index among the sorted folder names (torchvision's ImageFolder numbering)."""


def _labels(path, key: str, held: CalibrationData | None) -> np.ndarray:
    path = Path(path) if path is not None else None
    if path is None or path.suffix != ".npz":
        raise GraphfixError("--labels needs an .npz", f"labels are read as {path}[{key!r}]",
                            "give --eval-data FILE.npz holding the labels array")
    with np.load(path, allow_pickle=False) as archive:
        if key not in archive.files:
            raise GraphfixError(f"no array {key!r} in {path}",
                                f"it has {', '.join(archive.files)}", "pick one of those")
        labels = archive[key]
    if held is None:
        return labels
    start, stop = held.span  # the compared samples' rows in the labels' file
    if stop is None or len(labels) < stop:
        raise GraphfixError(
            f"{path}[{key!r}] has {len(labels)} labels, but the compared samples are rows "
            f"{start + 1}-{stop if stop is not None else '?'} of the data",
            "each compared sample needs its label, at its own row",
            "give one label per sample of the data")
    return labels[start:stop]


def run(model: onnx.ModelProto, loaded: Loaded, options: Options, progress=None,
        for_cache: bool = False) -> CalibrationResult:
    result = calibrate(
        model, loaded.calib, options.request, eval_data=loaded.eval, labels=loaded.labels,
        exclude_nodes=options.exclude_nodes, exclude_op_types=options.exclude_op_types,
        bins=options.bins, memory_budget=options.memory_budget, progress=progress,
        every_tensor=for_cache, providers=options.providers,
    )
    result.notes[:0] = loaded.notes
    return result


def write_outputs(result: CalibrationResult, files: WriteSet, out: Path | None,
                  cache: Path | None, ranges: Path | None, options: Options) -> list[str]:
    """Stage the Q/DQ model (unless `out` is None), the cache and the ranges in `files`
    (the caller commits); what was written, a line each."""
    chosen = result.outcome()
    written = []
    if out is not None:
        files.model(chosen.model, out)
        written.append(f"{out} ({chosen.method})")
    if cache is not None:
        version = cache_version(options.trt)
        algorithm = chosen.cache_algorithm
        text = cache_format.write_cache(chosen.amaxes, algorithm=algorithm,
                                        trt_version=version)
        files.text(cache, text, "--cache")
        written.append(f"{cache} (TensorRT {version} cache, {algorithm})")
    if ranges is not None:
        import json

        files.text(ranges, json.dumps(result.ranges_json(), indent=2) + "\n", "--ranges")
        written.append(str(ranges))
    result.notes.extend(_doctor_notes(chosen.model, options.trt))
    return written


def target_version(text: str | None) -> str:
    """--trt, else the installed TensorRT, else DEFAULT_CACHE_TRT (what --help says)."""
    from graphfix.trt import installed_tensorrt_version

    return text or installed_tensorrt_version() or DEFAULT_CACHE_TRT


def cache_version(text: str | None) -> str:
    """The TensorRT version the cache header names (--trt, else the installed or default
    one); GraphfixError for TensorRT 11 and later, which read no cache."""
    from graphfix.trt import parse_target

    target = parse_target(target_version(text))
    if target.at_least("11.0"):
        raise GraphfixError(
            f"no calibration cache for TensorRT {target.effective}",
            "TensorRT 11 removed implicit INT8 calibration: it reads quantization only "
            "as Q/DQ in the ONNX model, which graphfix calibrate writes anyway",
            "drop --cache, or give --trt 10.x for a TensorRT 10 (or older) cache",
        )
    parts = (target.effective.split(".") + ["0", "0"])[:3]
    return ".".join(parts)


def _doctor_notes(model: onnx.ModelProto, trt: str | None) -> list[str]:
    """doctor's Q/DQ findings one by one; what its other rules find, in one line when
    they say the model will not parse (a detector's NMS, an op TensorRT lacks: the FP32
    model did not parse either, and calibrating does not change that)."""
    from graphfix.doctor import diagnose
    from graphfix.doctor.engine import rules
    from graphfix.trt import parse_target

    target = parse_target(target_version(trt))
    findings = diagnose(model, target, only=["qdq"]).findings
    notes = [f"graphfix doctor ({target.label()}): {f.severity} {f.rule}: {f.message}"
             for f in findings] or [f"graphfix doctor: no Q/DQ findings for {target.label()}"]
    others = diagnose(model, target, only=[r.name for r in rules() if r.name != "qdq"])
    if not others.parses():
        notes.append(f"{others.verdict()} (not from Q/DQ: `graphfix doctor OUT --trt "
                     f"{target.effective}` says why; `graphfix run MODEL --trt "
                     f"{target.effective}` before calibrating rewrites what it can)")
    return notes


def quantize_from_cache(model: onnx.ModelProto, path: Path, options: Options) -> onnx.ModelProto:
    """A Q/DQ model from a TensorRT calibration cache: amax = scale * 127 per tensor."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise GraphfixError(f"cannot read the calibration cache {path}", str(err),
                            "give the path of a TensorRT calibration cache (a text file)"
                            ) from None
    amaxes = cache_format.cache_amaxes(text)
    fp32, _, plan = planned(model, exclude_nodes=options.exclude_nodes,
                            exclude_op_types=options.exclude_op_types)
    qdq.require_activations(plan, fp32)
    missing = [t for t in plan.activations if t not in amaxes]
    if missing:
        raise GraphfixError(
            f"the cache has no range for {len(missing)} of the {len(plan.activations)} "
            f"tensors to quantize (e.g. {', '.join(missing[:3])})",
            "a cache holds the tensors of the model it was made for, under TensorRT's names",
            "use the cache made for this model (same ONNX export), or calibrate with --data",
        )
    return qdq.quantize(fp32, plan, amaxes)


def summary(result: CalibrationResult, loaded: Loaded, written: list[str]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "data": loaded.calib.describe() + (f"; evaluated on {loaded.eval.describe()}"
                                           if loaded.eval is not None else ""),
        "tensors": len(result.stats),
        "stats_seconds": round(result.stats_seconds, 3),
        "methods": [o.summary() for o in result.outcomes],
        "recommended": result.recommended,
        "clipping": [c.to_json() for c in result.outcome().clips],
        "clipping_threshold_db": clipping.LOSS_DB,
        "notes": result.notes,
        "written": written,
    }
