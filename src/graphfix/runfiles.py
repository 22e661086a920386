"""The files `graphfix.run` writes besides the model: `--dump-after` snapshots and
split-nms's NMS part and manifest, all staged in the command's `WriteSet`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from graphfix.errors import GraphfixError
from graphfix.report import ROLLED_BACK, PassRecord

if TYPE_CHECKING:
    from graphfix.passes.manager import PassCallback
    from graphfix.passes.pipeline import Pipeline
    from graphfix.writeset import WriteSet


def default_output(model: Path) -> Path:
    """`<stem>.graphfix.onnx` beside the input."""
    return model.with_name(f"{model.stem}.graphfix.onnx")


def check_dump_after(which: str | None, pipeline: Pipeline) -> None:
    """--dump-after must name a pass of the pipeline (or be 'all')."""
    if not which or which == "all":
        return
    names = {s.name for s in pipeline.pass_specs()} | {str(s) for s in pipeline.pass_specs()}
    if which not in names:
        raise GraphfixError(f"--dump-after names '{which}', which is not in the pipeline",
                            f"the pipeline is {pipeline}",
                            "name one of its passes, or use --dump-after all")


def claim_split(pipeline: Pipeline, out: Path, files: WriteSet) -> None:
    """With split-nms in the pipeline, its two side files are claimed now: a clash is
    found before any work."""
    if any(spec.name == "split-nms" for spec in pipeline.pass_specs()):
        from graphfix.nms.chain import split_paths

        parts = split_paths(out)
        files.claim(parts.nms, "split-nms's NMS model", model=True)
        files.claim(parts.manifest, "split-nms's manifest")


def save_split(artifacts: dict[str, Any], out: Path, files: WriteSet) -> list[str]:
    """Stage split-nms's NMS part and manifest beside the output; lines saying what."""
    split = artifacts.get("split-nms")
    if split is None:
        return []
    from graphfix.nms.chain import save_split as save

    paths = save(split, out, files=files)
    return [f"wrote {paths.backbone}: the backbone, for TensorRT",
            f"wrote {paths.nms}: the NMS post-processing, for onnxruntime",
            f"wrote {paths.manifest}: how to chain them (graphfix.nms.run_split)"]


def dumper(out: Path, which: str, files: WriteSet, said: list[str],
           then: PassCallback | None = None) -> PassCallback:
    """The on_pass_done callback of --dump-after: the model after the pass, and for a pass
    rolled back, the model it produced (`.REJECTED.onnx`), or in `said` why there is none;
    staged in `files`, written with the output. `then` is called after (the caller's own
    callback)."""
    from graphfix.weights import materialized

    def dump(record: PassRecord, model: onnx.ModelProto) -> None:
        if then is not None:
            then(record, model)
        if which != "all" and which not in (record.spec, record.spec.split("{")[0]):
            return
        name = record.spec.split("{")[0]
        stem = f"{out.stem}.after-{record.index + 1:02d}-{name}"
        path = out.with_name(f"{stem}.onnx")
        files.model(materialized(model), path, "--dump-after")
        said.append(f"wrote {path}: the model after {record.spec}")
        if record.status != ROLLED_BACK:
            return
        if record.rejected is None:
            said.append(f"{record.spec} was rolled back before it produced a model (it "
                        "raised): there is no rejected model to dump")
            return
        path = out.with_name(f"{stem}.REJECTED.onnx")
        files.model(materialized(record.rejected), path, "--dump-after")
        said.append(f"wrote {path}: the model {record.spec} produced, which was rolled back")

    return dump
