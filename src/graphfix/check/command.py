"""`graphfix.check`: the command's whole work, for the API and the CLI.

Loads the two models (or a TensorRT engine), makes the samples, compares layer by
layer (`check.layerwise`) or as detections (`nms.compare`), diagnoses the candidate
for a TensorRT target, and writes the JSON and HTML reports. Never prints.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from graphfix.errors import GraphfixError
from graphfix.runtime.feeds import DEFAULT_SEED

if TYPE_CHECKING:
    from graphfix.check.layerwise import LayerwiseReport
    from graphfix.nms.compare import DetectionReport

PathLike = str | os.PathLike
DEFAULT_SAMPLES = 3


def check(
    reference: onnx.ModelProto | PathLike,
    candidate: onnx.ModelProto | PathLike | None = None,
    *,
    data: PathLike | None = None,
    data_key: str | None = None,
    preprocess: str | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    input_values: Mapping[str, Any] | None = None,
    samples: int | None = None,
    seed: int = DEFAULT_SEED,
    mode: str = "auto",
    atol: float | None = None,
    rtol: float | None = None,
    sqnr_threshold: float = 20.0,
    run_report: PathLike | None = None,
    memory_budget: int | str | None = None,
    providers: str | Sequence[str] = ("cpu",),
    engine: PathLike | None = None,
    trt_engine: bool = False,
    trt_precision: str = "fp32",
    trt_workspace: int | str | None = None,
    detections: bool = False,
    trt: str | None = None,
    json_out: PathLike | None = None,
    html: PathLike | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> LayerwiseReport | DetectionReport:
    """Compare every tensor `reference` and `candidate` share on every sample, in
    topological order: the first diverging tensor and the nodes where the error starts
    (`graphfix check`, docs/check.md). Returns a `LayerwiseReport` (`.passed`,
    `.to_json()`), or with `detections` a `nms.compare.DetectionReport` (graph outputs
    read as detections, matched by IoU).

    `samples` (default 3): the first ones of `data` (anything `graphfix calibrate --data`
    reads; `preprocess` for an image folder, as --preprocess), else seeded random inputs
    (`seed`, sample i with seed + i; `input_shapes` sizes dynamic dims; `input_values`
    fixes inputs). `mode`: strict (tolerances per dtype, or `atol`/`rtol`), sqnr
    (quantized candidates, `sqnr_threshold` dB), auto: sqnr when the candidate has Q/DQ.
    `run_report`: a `graphfix run --report` JSON whose renames and removals map the
    tensors (default: the candidate's provenance).
    `engine`: a serialized TensorRT engine to run instead of `candidate` (its tensors are
    named by `reference`); `trt_engine`: build one from `candidate` (or from `reference`
    when there is no candidate) with `trt_precision` and `trt_workspace` (both need
    tensorrt and a GPU). `trt`: also diagnose the candidate for that TensorRT version
    (`LayerwiseReport.doctor`). `json_out` / `html`: write the JSON or a self-contained
    HTML report there (claimed before any work, written together).
    """
    from graphfix.writeset import WriteSet

    given = [_given(reference, "REFERENCE", True), _given(candidate, "CANDIDATE", True),
             _given(engine, "--engine", False), _given(data, "--data", False),
             _given(run_report, "--run-report", False)]
    with WriteSet(given) as files:
        files.claim(json_out, "--json-out")
        files.claim(html, "--html")
        if detections and html is not None:
            raise GraphfixError("--html and --detections were both given",
                                "the HTML report plots tensors layer by layer, and "
                                "--detections compares only the graph outputs",
                                "drop --html, or --detections")
        result, cand = _compare(reference, candidate, data, data_key, input_shapes, input_values,
                          samples or DEFAULT_SAMPLES, seed, mode, atol, rtol, sqnr_threshold,
                          run_report, memory_budget, providers, engine, trt_engine,
                          trt_precision, trt_workspace, detections, progress, preprocess)
        if trt is not None and not detections:
            from graphfix.doctor import diagnose
            from graphfix.trt import parse_target

            result.doctor = diagnose(cand, parse_target(trt), name=_label(
                candidate if candidate is not None else reference)).to_json()
        if json_out is not None:
            files.text(json_out, json.dumps(result.to_json(), indent=2) + "\n", "--json-out")
        if html is not None:
            from graphfix.htmlreport import check_html

            files.text(html, check_html(result, reference=_label(reference),
                                        candidate=_label(candidate or engine or reference)),
                       "--html")
        files.commit()
    return result


def _compare(reference, candidate, data, data_key, input_shapes, input_values, count, seed,
             mode, atol, rtol, sqnr_threshold, run_report, memory_budget, providers, engine,
             trt_engine, trt_precision, trt_workspace, detections, progress, preprocess=None):
    from graphfix import provenance
    from graphfix.check.layerwise import compare_layerwise, has_qdq, tensor_names
    from graphfix.check.samples import check_samples, tolerance_override
    from graphfix.runtime.session import provider_names
    from graphfix.sizes import parse_bytes

    providers = provider_names(providers)  # a usage error before any work
    budget = parse_bytes(memory_budget) if isinstance(memory_budget, str) else memory_budget
    workspace = parse_bytes(trt_workspace) if isinstance(trt_workspace, str) else trt_workspace
    ref, cand, spec = _models(reference, candidate, engine, trt_engine, trt_precision, workspace)
    renamed, removed = provenance.read(cand)
    if run_report is not None:
        renamed, removed = _from_report(Path(run_report))
    if cand is not ref:
        _refuse_other_inputs(ref, cand, renamed)
    feeds = check_samples(ref, data, data_key, input_shapes or {}, count, seed, input_values,
                          preprocess)
    if detections:
        from graphfix.nms.compare import compare_models

        return compare_models(ref, cand, feeds, providers=providers), cand
    opened = None
    if spec is not None:
        from graphfix.check.engine import open_engine

        wanted = [renamed.get(t, t) for t in tensor_names(ref)]
        opened = open_engine(spec, wanted, feeds, has_qdq=has_qdq(cand))
    try:
        result = compare_layerwise(
            ref, cand, feeds, renamed=renamed, removed=removed, mode=mode,
            sqnr_threshold=sqnr_threshold, tolerance=tolerance_override(atol, rtol),
            memory_budget=budget, providers=providers, engine=opened, progress=progress)
    finally:
        if opened is not None:
            opened.close()
    return result, cand


def _refuse_other_inputs(ref: onnx.ModelProto, cand: onnx.ModelProto,
                         renamed: Mapping[str, str]) -> None:
    """GraphfixError when the candidate has an input the reference lacks (by name, or
    renamed from one of the reference's): the samples are made for the reference's
    inputs, so the candidate could not be fed. A candidate without some of the
    reference's inputs (an unused one removed) is compared as before."""
    from graphfix.runtime.feeds import graph_inputs

    back = {new: old for old, new in renamed.items()}
    ref_names = [i.name for i in graph_inputs(ref)]
    cand_names = [i.name for i in graph_inputs(cand)]
    extra = [n for n in cand_names if n not in ref_names and back.get(n) not in ref_names]
    if not extra:
        return
    fed = {back.get(n, n) for n in cand_names}
    missing = [n for n in ref_names if n not in fed]

    def names(found: list[str]) -> str:
        shown = ", ".join(f"'{n}'" for n in found[:5])
        return shown + (f" and {len(found) - 5} more" if len(found) > 5 else "")

    only_ref = f"; only the reference has {names(missing)}" if missing else ""
    raise GraphfixError(
        f"the candidate's inputs are not the reference's: only the candidate has "
        f"{names(extra)}{only_ref}",
        f"check runs both models on the same samples, made for the reference's inputs "
        f"({names(ref_names) or 'none'}), so each input of the candidate must be one of "
        "them (by name, or renamed from one by graphfix run)",
        "compare a model with the one it was made from: REFERENCE the original, "
        "CANDIDATE what `graphfix run` wrote from it (if another tool renamed the "
        "inputs, give the candidate the reference's input names)",
    )


def _models(reference, candidate, engine, trt_engine: bool, precision: str,
            workspace: int | None):
    """(reference model, candidate model, EngineSpec or None). An engine's tensors are
    named by the reference; `trt_engine` without a candidate builds the reference."""
    from graphfix.check.engine import EngineSpec, is_engine_path

    if engine is not None and (trt_engine or candidate is not None):
        raise GraphfixError("--engine was given with CANDIDATE or --trt-engine",
                            "--engine FILE is the candidate: an engine already built",
                            "give one candidate: CANDIDATE (with --trt-engine to build it) "
                            "or --engine FILE")
    if candidate is None and engine is None and not trt_engine:
        raise GraphfixError("No model to check", "CANDIDATE is missing",
                            "give CANDIDATE, --engine FILE, or --trt-engine to compare "
                            "REFERENCE with the TensorRT engine built from it")
    ref = _load(reference)
    if engine is not None:
        return ref, ref, EngineSpec(Path(engine), precision, workspace)
    if candidate is not None and not isinstance(candidate, onnx.ModelProto) \
            and is_engine_path(Path(candidate)):
        raise GraphfixError(f"CANDIDATE {candidate} is a TensorRT engine",
                            "CANDIDATE is an ONNX model; engines are given with --engine",
                            f"use --engine {candidate}")
    cand = ref if candidate is None else _load(candidate)
    source = Path(candidate if candidate is not None else reference) \
        if not isinstance(candidate if candidate is not None else reference,
                          onnx.ModelProto) else None
    if trt_engine and source is None:
        raise GraphfixError("--trt-engine needs the candidate as a file",
                            "TensorRT builds the engine from the ONNX file",
                            "save the model and pass its path")
    return ref, cand, EngineSpec(source, precision, workspace) if trt_engine else None


def _load(model: onnx.ModelProto | PathLike) -> onnx.ModelProto:
    from graphfix import io

    if isinstance(model, onnx.ModelProto):
        return model
    return io.load(model, weights=False)  # large weights stay in their file


def _from_report(path: Path) -> tuple[dict, dict]:
    try:
        data = json.loads(path.read_text())
        return dict(data.get("renamed", {})), dict(data.get("removed", {}))
    except (OSError, ValueError, AttributeError) as err:
        raise GraphfixError(f"cannot read the run report {path}", str(err),
                            "give the JSON written by `graphfix run --report`") from None


def _given(path, what: str, model: bool):
    from graphfix.writeset import Given

    if path is None or isinstance(path, onnx.ModelProto):
        return None
    return Given(Path(path), what, model=model)


def _label(model) -> str:
    return "a model given in memory" if isinstance(model, onnx.ModelProto) else str(model)
