"""`graphfix.calibrate`: the command's whole work, for the API and the CLI.

Checks every option before any statistics are collected, reads the data, calibrates
(`calibration.session`), writes the Q/DQ model, the cache, the ranges and the JSON and
HTML reports as one set, and returns a typed result. Never prints.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from graphfix.calibration import methods, session
from graphfix.calibration.runner import CalibrationResult
from graphfix.errors import GraphfixError

PathLike = str | os.PathLike
SCHEMA = session.SCHEMA


@dataclass
class Calibration:
    """What `calibrate` made. `model`: the Q/DQ model (written to `output` when given),
    with the ranges of `method`. `details`: every method's ranges, the statistics, the
    per-tensor choices and the bad clips (None when the ranges came from a cache).
    `summary`: the JSON `to_json` returns (schema graphfix.calibrate/2)."""

    model: onnx.ModelProto
    method: str
    details: CalibrationResult | None
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def written(self) -> list[str]:
        return list(self.summary.get("written", []))

    @property
    def notes(self) -> list[str]:
        return list(self.summary.get("notes", []))

    def to_json(self) -> dict[str, Any]:
        return dict(self.summary)


def calibrate(
    model: onnx.ModelProto | PathLike,
    *,
    data: PathLike | None = None,
    data_key: str | None = None,
    preprocess: str | None = None,
    data_loader_script: str | None = None,
    samples: int | None = None,
    batch_size: int = 1,
    method: str = methods.DEFAULT,
    percentile: float = methods.PERCENTILE.default,
    per_tensor: bool = False,
    output: PathLike | None = None,
    cache: PathLike | None = None,
    ranges: PathLike | None = None,
    from_cache: PathLike | None = None,
    trt: str | None = None,
    evaluate: bool = False,
    eval_split: int | None = None,
    eval_data: PathLike | None = None,
    eval_key: str | None = None,
    labels: str | None = None,
    exclude_nodes: Sequence[str] = (),
    exclude_op_types: Sequence[str] = (),
    bins: int = 2048,
    memory_budget: int | str | None = None,
    providers: str | Sequence[str] = ("cpu",),
    json_out: PathLike | None = None,
    html: PathLike | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Calibration:
    """Calibrate `model` for INT8: a symmetric Q/DQ model TensorRT accepts
    (`graphfix calibrate`, docs/calibrate.md).

    `data` (a folder of .npy/.npz files or images with `preprocess`, or one .npz with a
    leading sample axis, `data_key` choosing the array) or `data_loader_script`
    ("file.py:func", executed); `samples` caps how many are used, `batch_size` how many
    one onnxruntime run takes (results do not depend on it). `method`: one of
    `methods.names()`, comma-separated several, or "all" (`methods.cli_help()`); the
    default, auto, picks per tensor. `evaluate`, `eval_split`, `eval_data`/`eval_key`,
    `labels`: compare each method's Q/DQ model with FP32 on held-apart samples.
    `from_cache`: a TensorRT calibration cache to turn into a Q/DQ model (no data).
    Files, all claimed before any work and written together: `output` the model,
    `cache` the legacy TensorRT cache (TensorRT <= 10, header for `trt`), `ranges` every
    method's ranges, `json_out` the summary, `html` a report with every tensor's
    histogram and the ranges chosen.
    """
    from graphfix import io
    from graphfix.runtime.session import provider_names
    from graphfix.sizes import parse_bytes
    from graphfix.writeset import Given, WriteSet

    path = None if isinstance(model, onnx.ModelProto) else Path(model)
    script = data_loader_script.rpartition(":")[0] \
        if data_loader_script and ":" in data_loader_script else data_loader_script
    given = [Given(path, "the input model", model=True) if path else None,
             *(Given(p, flag) for p, flag in ((data, "--data"), (eval_data, "--eval-data"),
                                              (from_cache, "--from-cache"),
                                              (script, "--data-loader-script")) if p)]
    with WriteSet(given) as files:
        options = session.Options(  # checks the methods and their options first
            method=method, method_options={methods.PERCENTILE.flag: percentile},
            per_tensor=per_tensor, exclude_nodes=list(exclude_nodes),
            exclude_op_types=list(exclude_op_types), bins=bins,
            memory_budget=parse_bytes(memory_budget) if isinstance(memory_budget, str)
            else memory_budget, trt=trt, providers=provider_names(providers))
        _claim(files, path, output, cache, ranges, json_out, html, options, from_cache)
        source = io.load(path) if path else model
        if from_cache is not None:
            made = _from_cache(source, from_cache, options, output, files)
        else:
            if data is None and data_loader_script is None:
                raise GraphfixError("no calibration data", "calibration needs sample inputs",
                                    "give --data PATH (or --data-loader-script, or "
                                    "--from-cache)")
            loaded = session.load_data(source, data, data_key, preprocess, data_loader_script,
                                       samples, batch_size, eval_split, eval_data, eval_key,
                                       labels, evaluate or labels is not None
                                       or len(options.request.labels()) > 1)
            result = session.run(source, loaded, options, for_cache=cache is not None,
                                 progress=progress)
            written = session.write_outputs(result, files, output, cache, ranges, options)
            chosen = result.outcome()
            made = Calibration(chosen.model, chosen.method, result,
                               session.summary(result, loaded, written))
        _reports(made, files, json_out, html, path)
        files.commit()
    return made


def _claim(files, path, output, cache, ranges, json_out, html, options, from_cache) -> None:
    """Every output claimed, and what can be refused refused, before any work."""
    from graphfix import io

    if output is not None:
        io.check_output_path(output, input_path=path)
        files.claim(output, "the output model", model=True)
    if cache is not None:
        if from_cache is not None:
            raise GraphfixError("--cache and --from-cache were both given",
                                "--from-cache reads ranges from a cache; there are no new "
                                "ones to write", "drop --cache")
        files.claim(cache, "--cache")
        session.cache_version(options.trt)  # TensorRT 11 has none: say so before work
    if html is not None and from_cache is not None:
        raise GraphfixError("--html was given with --from-cache",
                            "the report plots each tensor's histogram, and a cache holds "
                            "only ranges", "drop --html")
    files.claim(ranges, "--ranges")
    files.claim(json_out, "--json-out")
    files.claim(html, "--html")


def _from_cache(source, cache_path, options, output, files) -> Calibration:
    made = session.quantize_from_cache(source, cache_path, options)
    written = []
    if output is not None:
        files.model(made, output)
        written.append(f"{output} (from {cache_path})")
    summary = {"schema": SCHEMA, "from_cache": str(cache_path), "methods": [],
               "recommended": "cache", "clipping": [], "notes": [], "written": written}
    return Calibration(made, "cache", None, summary)


def _reports(made: Calibration, files, json_out, html, path) -> None:
    """Stage the JSON summary and the HTML report; both are named in `written`."""
    made.summary["written"] = [*made.summary.get("written", []),
                               *(str(p) for p in (json_out, html) if p is not None)]
    if json_out is not None:
        files.text(json_out, json.dumps(made.to_json(), indent=2) + "\n", "--json-out")
    if html is not None:  # not with --from-cache (refused by _claim): details are there
        from graphfix.htmlreport import calibrate_html

        files.text(html, calibrate_html(made.details, model=str(path or "model")), "--html")
