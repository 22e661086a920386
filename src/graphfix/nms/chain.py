"""A split detector: its manifest, running the two parts chained, writing them out.

`<stem>.split.json` (schema `graphfix.split/1`)::

    {"schema": "graphfix.split/1",
     "backbone": "out.onnx", "nms": "out.nms.onnx",     # file names beside the manifest
     "inputs":  [{"name": "images", "dtype": "float32", "shape": [3, 320, 320]}],
     "cut":     [{"name": "boxes_pre", "dtype": "float32", "shape": [3234, 4]}, ...],
     "nms_inputs": ["boxes_pre", ..., "score_thr"],     # cut tensors, then model inputs
     "outputs": [{"name": "boxes", "from": "nms"}, ...],  # the original outputs, in order
     "regions": ["If 'If_4349'.else_branch > NonMaxSuppression 'nms'"]}

Shapes hold an int, a symbolic name, or null (unknown) per dim. To run: feed the
original inputs to the backbone, then the backbone's cut outputs (and the model inputs
named in `nms_inputs`) to the NMS part; each original output comes from the part its
`from` names (`run_split` does it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from graphfix.errors import GraphfixError

if TYPE_CHECKING:
    from graphfix.writeset import WriteSet

SCHEMA = "graphfix.split/1"
FROM_BACKBONE = "backbone"
FROM_NMS = "nms"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: list[int | str | None] | None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": self.shape}


@dataclass
class SplitManifest:
    """How the two parts chain (see the module docstring); `directory` is where the
    files named here lie (set when loaded from a file)."""

    backbone: str
    nms: str
    inputs: list[TensorSpec]
    cut: list[TensorSpec]
    nms_inputs: list[str]
    outputs: list[tuple[str, str]]
    regions: list[str] = field(default_factory=list)
    directory: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "backbone": self.backbone, "nms": self.nms,
            "inputs": [t.to_json() for t in self.inputs],
            "cut": [t.to_json() for t in self.cut],
            "nms_inputs": list(self.nms_inputs),
            "outputs": [{"name": n, "from": f} for n, f in self.outputs],
            "regions": list(self.regions),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], directory: str = "") -> SplitManifest:
        if data.get("schema") != SCHEMA:
            raise GraphfixError("Not a graphfix split manifest",
                                f"its schema is {data.get('schema')!r}, not {SCHEMA!r}",
                                "give the .split.json that `graphfix run --passes split-nms` "
                                "wrote")
        try:
            return cls(
                backbone=data["backbone"], nms=data["nms"],
                inputs=[TensorSpec(**t) for t in data["inputs"]],
                cut=[TensorSpec(**t) for t in data["cut"]],
                nms_inputs=list(data["nms_inputs"]),
                outputs=[(o["name"], o["from"]) for o in data["outputs"]],
                regions=list(data.get("regions", [])), directory=directory,
            )
        except (KeyError, TypeError) as err:
            raise GraphfixError("The split manifest is incomplete", f"it lacks {err}",
                                "write it again with `graphfix run --passes split-nms`"
                                ) from None


@dataclass
class SplitModel:
    """The two parts in memory: the backbone (None once it is the pipeline's model,
    which later passes may still rewrite) and the NMS part, with their manifest."""

    nms: onnx.ModelProto
    manifest: SplitManifest
    backbone: onnx.ModelProto | None = None


def run_split(split: SplitModel | SplitManifest | str | os.PathLike,
              feeds: Mapping[str, np.ndarray], providers: Sequence[str] = ("cpu",),
              backbone: onnx.ModelProto | None = None) -> dict[str, np.ndarray]:
    """Run the backbone, then the NMS part on its cut tensors; returns the original
    model's outputs by name. `split` is a manifest path, a manifest, or the parts in
    memory (then `backbone`, or `split.backbone`, is the backbone)."""
    from graphfix.runtime.outputs import run_checkable

    if isinstance(split, (str, os.PathLike)):
        split = load_manifest(split)
    if isinstance(split, SplitManifest):
        manifest = split
        backbone = backbone or _load_part(manifest, manifest.backbone)
        nms = _load_part(manifest, manifest.nms)
    else:
        manifest, nms = split.manifest, split.nms
        backbone = backbone or split.backbone
        if backbone is None:
            raise GraphfixError("run_split got no backbone", "the split holds the NMS part "
                                "only", "pass backbone=the model the pipeline returned")
    declared = {i.name for i in backbone.graph.input}
    first = run_checkable(backbone, {k: v for k, v in feeds.items() if k in declared},
                          providers)
    values = {**feeds, **first}
    missing = [n for n in manifest.nms_inputs if n not in values]
    if missing:
        raise GraphfixError("Cannot run the NMS part", f"nothing gives {', '.join(missing)}",
                            "feed every original model input")
    second = run_checkable(nms, {n: values[n] for n in manifest.nms_inputs}, providers)
    parts = {FROM_BACKBONE: first, FROM_NMS: second}
    return {name: parts[source][name] for name, source in manifest.outputs}


def load_manifest(path: str | os.PathLike) -> SplitManifest:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise GraphfixError(f"Cannot read the split manifest '{os.fspath(path)}'", str(err),
                            "give the .split.json that `graphfix run` wrote") from None
    return SplitManifest.from_json(data, os.path.dirname(os.path.abspath(path)))


def _load_part(manifest: SplitManifest, name: str) -> onnx.ModelProto:
    """A part named by the manifest, which must sit beside it: a name with a folder in
    it (a path separator, `..`) is refused, whatever the manifest says."""
    from graphfix import io

    if not isinstance(name, str) or name in ("", ".", "..") or name != os.path.basename(
            name.replace("\\", "/")):
        raise GraphfixError(f"The split manifest names the part {name!r}, not a file beside it",
                            "graphfix writes the parts beside their manifest and reads them "
                            "only from there", "write the split again with `graphfix run "
                            "--passes split-nms`")
    return io.load(os.path.join(manifest.directory, name))


@dataclass(frozen=True)
class SplitPaths:
    backbone: Path
    nms: Path
    manifest: Path


def split_paths(backbone_path: str | os.PathLike) -> SplitPaths:
    """`out.onnx` -> out.onnx, out.nms.onnx, out.split.json (beside each other)."""
    path = Path(backbone_path)
    stem = path.name[:-5] if path.name.endswith(".onnx") else path.name
    return SplitPaths(path, path.with_name(f"{stem}.nms.onnx"),
                      path.with_name(f"{stem}.split.json"))


def save_split(split: SplitModel, backbone_path: str | os.PathLike,
               input_path: str | os.PathLike | None = None, files: WriteSet | None = None
               ) -> SplitPaths:
    """Write the NMS part and the manifest beside the backbone (written by the caller,
    e.g. `graphfix.save(result.model, backbone_path)`); atomic writes. With `files`, they
    are staged there instead, written when the caller commits the set."""
    from graphfix.writeset import Given, WriteSet

    paths = split_paths(backbone_path)
    manifest = replace(split.manifest, backbone=paths.backbone.name, nms=paths.nms.name)
    owned = files is None
    if files is None:
        files = WriteSet([Given(input_path, "the input model", model=True)]
                         if input_path else [])
    try:
        files.model(split.nms, paths.nms, "split-nms's NMS model")
        files.text(paths.manifest, json.dumps(manifest.to_json(), indent=2) + "\n",
                   "split-nms's manifest")
        if owned:
            files.commit()
    finally:
        if owned:
            files.discard()
    return paths
