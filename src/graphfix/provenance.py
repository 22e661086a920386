"""Where a rewritten model's tensors came from: the renames and removals of `graphfix run`,
kept in the output model's metadata so `graphfix check ref.onnx out.onnx` can match
tensors across the rewrite without the run's report.

Stored as metadata_props["graphfix.provenance"] = JSON {"renamed": {old: new},
"removed": {tensor: pass spec}}: a tensor in `removed` no longer exists because that
pass merged it away (a BatchNormalization output folded into its Conv, ...).

Names are those of the model the first `graphfix run` read: a run on a model that
already carries provenance composes its own renames and removals with it (`compose`),
so `graphfix check a.onnx c.onnx` works after `run a -> b` and `run b -> c`.
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


def compose(
    earlier: tuple[dict[str, str], dict[str, str]],
    renamed: dict[str, str],
    removed: dict[str, str],
) -> tuple[dict[str, str], dict[str, str]]:
    """(renamed, removed) from the original model's names to the newest model's, given the
    provenance an input model carried (`earlier`, original -> input) and a run's own maps
    (input -> output). Renames chain (a -> b, then b -> c gives a -> c); a renamed tensor
    the run removed is removed under its original name; earlier removals are kept."""
    first_renamed, first_removed = earlier
    out_renamed: dict[str, str] = {}
    out_removed = dict(first_removed)
    for original, name in first_renamed.items():
        if name in removed:
            out_removed.setdefault(original, removed[name])
        elif renamed.get(name, name) != original:
            out_renamed[original] = renamed.get(name, name)
    known = set(first_renamed.values())  # the input's names for tensors renamed before
    for name, new in renamed.items():
        if name not in known:
            out_renamed.setdefault(name, new)
    for name, spec in removed.items():
        if name not in known:
            out_removed.setdefault(name, spec)
    return out_renamed, out_removed


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
