"""`graphfix check`: layer-wise agreement of two models, naming where they start to differ."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from graphfix.cli.common import EXIT_FAILED, INPUT_VALUE_HELP, console, input_values, user_errors


def check_command(
    ctx: typer.Context,
    reference: Path = typer.Argument(..., help="The reference model (e.g. the FP32 original)."),
    candidate: Path = typer.Argument(None, help="The model to check (rewritten, or Q/DQ "
                                     "INT8), or a TensorRT engine (.engine/.plan/.trt); "
                                     "with --trt it may be left out (REFERENCE is built)."),
    data: Path = typer.Option(None, "--data", help="Inputs: an .npz (input name -> array with "
                              "a leading sample axis), or anything `calibrate --data` takes."),
    data_key: str = typer.Option(None, "--data-key", help="The array to use in one .npz."),
    input_shape: list[str] = typer.Option(None, "--input-shape", help="NAME:DIMS for the "
                                          "random inputs' dynamic dims, e.g. x:1x3x224x224 "
                                          "(not needed with --data)."),
    input_value: list[str] = typer.Option(None, "--input-value", help=INPUT_VALUE_HELP),
    samples: int = typer.Option(3, "--samples", min=1, help="How many samples to compare "
                                "(every one is compared; the worst is reported)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random inputs."),
    mode: str = typer.Option("auto", "--mode", help="strict (tolerances per dtype), sqnr "
                             "(quantized models), or auto: sqnr when CANDIDATE has Q/DQ."),
    atol: float = typer.Option(None, "--atol", help="Absolute tolerance for float tensors "
                               "(default: per dtype, graphfix.runtime.tolerances)."),
    rtol: float = typer.Option(None, "--rtol", help="Relative tolerance for float tensors."),
    sqnr: float = typer.Option(20.0, "--sqnr-threshold", help="SQNR (dB) a tensor needs in "
                               "sqnr mode."),
    report: Path = typer.Option(None, "--report", help="A `graphfix run --report` JSON whose "
                                "renames/removals to use (default: CANDIDATE's metadata)."),
    memory_budget: str = typer.Option(None, "--memory-budget", help="Activation memory one "
                                      "onnxruntime run may expose, e.g. 512MB."),
    providers: str = typer.Option("cpu", "--providers", help="onnxruntime providers."),
    trt: bool = typer.Option(False, "--trt", help="Run CANDIDATE as a TensorRT engine built "
                             "from it (needs tensorrt and a GPU; docs/check.md)."),
    trt_precision: str = typer.Option("fp32", "--trt-precision", help="The engine's "
                                      "precision: fp32 (TF32 off), fp16, bf16 or int8."),
    trt_workspace: str = typer.Option(None, "--trt-workspace", help="TensorRT's workspace "
                                      "limit, e.g. 2GB."),
    shown: int = typer.Option(15, "--show", min=1, help="Rows in each table."),
    detections: bool = typer.Option(False, "--detections", help="Compare the graph outputs "
                                    "as detections (NMS results), matching boxes by IoU: "
                                    "order and padding may differ (docs/nms-plugins.md)."),
    as_json: Path = typer.Option(None, "--json", help="Write the full result as JSON here "
                                 "('-' for standard output)."),
) -> None:
    """Compare every tensor REFERENCE and CANDIDATE share, in topological order; name the
    first diverging tensor and the nodes where the error starts. Exit 1 when they differ."""
    from graphfix import provenance
    from graphfix.check.layerwise import compare_layerwise, has_qdq, tensor_names
    from graphfix.check.samples import check_samples, tolerance_override
    from graphfix.runtime.session import provider_names
    from graphfix.sizes import parse_bytes
    from graphfix.writeset import Given, WriteSet

    json_file = as_json if as_json is not None and str(as_json) != "-" else None
    given = [Given(reference, "REFERENCE", model=True),
             Given(candidate, "CANDIDATE", model=True) if candidate else None,
             Given(data, "--data") if data else None,
             Given(report, "--report") if report else None]
    with user_errors(ctx), WriteSet(given) as files:
        files.claim(json_file, "--json")
        ort_providers = provider_names(providers)  # a usage error before any work
        ref, cand, engine_spec = _models(reference, candidate, trt, trt_precision,
                                         parse_bytes(trt_workspace) if trt_workspace else None)
        renamed, removed = provenance.read(cand)
        if report is not None:
            renamed, removed = _from_report(report)
        feeds = check_samples(ref, data, data_key, input_shape or [], samples, seed,
                              input_values(input_value))
        if detections:
            _detections(ref, cand, feeds, ort_providers, as_json, files)
            return
        engine = None
        if engine_spec is not None:
            from graphfix.check.engine import open_engine

            wanted = [renamed.get(t, t) for t in tensor_names(ref)]
            engine = open_engine(engine_spec, wanted, feeds, has_qdq=has_qdq(cand))
        try:
            result = compare_layerwise(
                ref, cand, feeds, renamed=renamed, removed=removed, mode=mode,
                sqnr_threshold=sqnr, tolerance=tolerance_override(atol, rtol),
                memory_budget=parse_bytes(memory_budget) if memory_budget else None,
                providers=ort_providers, engine=engine,
            )
        finally:
            if engine is not None:
                engine.close()
        exclude = _exclude_names(result, cand)
        text = ""
        if as_json is not None:
            data = result.to_json()
            data["exclude_nodes"] = exclude  # names in CANDIDATE, which calibrate plans on
            text = json.dumps(data, indent=2, default=str)
        if json_file is not None:
            files.text(json_file, text + "\n", "--json")
        files.commit()
    if json_file is None and as_json is not None:
        print(text)
    if str(as_json) != "-":
        _print(result, shown, exclude)
    if not result.passed:
        raise typer.Exit(EXIT_FAILED)


def _detections(ref, cand, feeds, providers: tuple[str, ...], as_json: Path | None,
                files) -> None:
    from graphfix.nms.compare import compare_models

    report = compare_models(ref, cand, feeds, providers=providers)
    if as_json is not None:
        text = json.dumps(report.to_json(), indent=2)
        if str(as_json) == "-":
            print(text)
        else:
            files.text(as_json, text + "\n", "--json")
    files.commit()
    if str(as_json) != "-":
        console.print(report.describe(), style="bold green" if report.ok else "bold red",
                      markup=False)
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def _models(reference: Path, candidate: Path | None, trt: bool, precision: str,
            workspace: int | None):
    """(reference model, candidate model, EngineSpec or None). An engine file's tensors
    are named by the reference; --trt without CANDIDATE builds REFERENCE."""
    from graphfix import io
    from graphfix.check.engine import EngineSpec, is_engine_path
    from graphfix.errors import GraphfixError

    if candidate is None and not trt:
        raise GraphfixError("No model to check", "CANDIDATE is missing",
                            "give CANDIDATE, or --trt to compare REFERENCE with the "
                            "TensorRT engine built from it")
    candidate = candidate or reference
    ref = io.load(reference, weights=False)  # large weights stay in their file
    if is_engine_path(candidate):
        return ref, ref, EngineSpec(candidate, precision, workspace)
    cand = ref if candidate == reference else io.load(candidate, weights=False)
    return ref, cand, EngineSpec(candidate, precision, workspace) if trt else None


def _from_report(path: Path) -> tuple[dict, dict]:
    from graphfix.errors import GraphfixError

    try:
        data = json.loads(path.read_text())
        return dict(data.get("renamed", {})), dict(data.get("removed", {}))
    except (OSError, ValueError, AttributeError) as err:
        raise GraphfixError(f"cannot read the run report {path}", str(err),
                            "give the JSON written by `graphfix run --report`") from None


def _num(value, spec: str = "{:.3g}") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return spec.format(value)


def _exclude_names(result, candidate) -> list[str]:
    """calibrate --exclude-nodes names for sqnr mode: the candidate's nodes (calibrate
    plans on the model after fold-bn, whose node names the candidate keeps) producing
    the origins, then the failing low-SQNR layers."""
    if result.mode != "sqnr":
        return []
    producers = {o: n.name for n in candidate.graph.node for o in n.output if n.name}
    tensors = [o.name for o in result.origins]
    tensors += [t.name for t in result.sensitivity(len(result.tensors)) if t.ok is False]
    names = [producers.get(result.tensor(t).candidate or t) for t in tensors]
    return list(dict.fromkeys(n for n in names if n))[:5]


def _print(result, shown: int, exclude: list[str]) -> None:
    from graphfix.check.engine import FUSED

    compared = [t for t in result.tensors if t.status == "compared"]
    merged = [t for t in result.tensors if t.status.startswith("merged by")]
    fused = [t for t in result.tensors if t.status == FUSED]
    console.print(f"{result.mode} mode ({result.runtime}): {len(compared)} tensors compared "
                  f"over {result.samples} sample(s) in {result.chunks} run(s); {len(merged)} "
                  "merged by graphfix passes" + (f", {len(fused)} fused by TensorRT"
                                                  if fused else ""), markup=False)
    if result.mode == "sqnr":
        rows = result.sensitivity(shown)
        title = "quantization sensitivity (lowest SQNR first)"
    else:
        rows = sorted((t for t in compared if t.ok is False),
                      key=lambda t: -(t.max_rel or 0))[:shown]
        title = "diverging tensors (worst first)"
    if rows:
        table = Table(title=title, title_justify="left")
        for col in ("tensor", "node", "max abs", "max rel", "SQNR dB", "worst sample"):
            table.add_column(col, overflow="fold")
        for t in rows:
            table.add_row(escape(t.name), escape(t.node), _num(t.max_abs), _num(t.max_rel),
                          _num(t.sqnr_db, "{:.1f}"), _num(t.worst_sample, "{}"),
                          style="red" if t.ok is False else "")
        console.print(table)
    if result.origins:
        table = Table(title="where the error starts (origins, most amplifying first)",
                      title_justify="left")
        for col in ("node", "tensor", "error", "inputs' error", "amplification"):
            table.add_column(col, overflow="fold")
        for o in result.origins[:shown]:
            table.add_row(escape(o.node), escape(o.name), _num(o.error), _num(o.input_error),
                          _num(o.amplification, "{:.3g}x"))
        console.print(table)
    for note in result.notes:
        console.print(f"note: {note}", markup=False)
    first = result.first_divergence
    if exclude:
        console.print("to keep the most sensitive layers in float: graphfix calibrate ... "
                      f"--exclude-nodes {','.join(exclude)}", markup=False)
    if first is None:
        verdict = ("every compared tensor agrees" if result.mode == "strict" else
                   f"every compared tensor is at or above {result.sqnr_threshold:g} dB SQNR")
        console.print(f"check passed: {verdict}", style="bold green", markup=False)
    else:
        console.print(f"first divergence: {first.name} (from {first.node}), worst at sample "
                      f"{first.worst_sample}", style="bold red" if not result.passed else "",
                      markup=False)
        console.print("check " + ("passed" if result.passed else "FAILED"),
                      style="bold green" if result.passed else "bold red", markup=False)
