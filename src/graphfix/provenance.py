"""Where a rewritten model's tensors came from: the renames and removals of `graphfix run`,
kept in the output model's metadata so `graphfix check ref.onnx out.onnx` can match
tensors across the rewrite without the run's report.

Stored as metadata_props["graphfix.provenance"] = JSON {"renamed": {old: new},
"removed": {tensor: pass spec}}: a tensor in `removed` no longer exists because that
pass merged it away (a BatchNormalization output folded into its Conv, ...).
"""

from __future__ import annotations

import json

import onnx

KEY = "graphfix.provenance"


def attach(model: onnx.ModelProto, renamed: dict[str, str], removed: dict[str, str]) -> None:
    """Write (or replace) the provenance entry of `model`, in place."""
    keep = [p for p in model.metadata_props if p.key != KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    if renamed or removed:
        entry = model.metadata_props.add()
        entry.key = KEY
        entry.value = json.dumps({"renamed": renamed, "removed": removed}, sort_keys=True)


def read(model: onnx.ModelProto) -> tuple[dict[str, str], dict[str, str]]:
    """(renamed, removed) recorded in `model`; empty when it has none or it is unreadable."""
    for prop in model.metadata_props:
        if prop.key == KEY:
            try:
                data = json.loads(prop.value)
                return dict(data.get("renamed", {})), dict(data.get("removed", {}))
            except (ValueError, AttributeError):
                return {}, {}
    return {}, {}
