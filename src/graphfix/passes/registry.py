"""The one explicit list of passes. CLI help, docs and tests enumerate it."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from graphfix.errors import GraphfixError, InternalError
from graphfix.passes.add_nms import AddNms
from graphfix.passes.base import Pass, check_pass_class
from graphfix.passes.bound_nms import BoundNms
from graphfix.passes.cleanup import Cleanup
from graphfix.passes.dedup_constants import DedupConstants
from graphfix.passes.defaults import DEFAULT_PIPELINE as _DEFAULT
from graphfix.passes.detect_unsupported import DetectUnsupported
from graphfix.passes.eliminate_noops import EliminateNoops
from graphfix.passes.fix_shapes import FixShapes
from graphfix.passes.fold_bn import FoldBatchNorm
from graphfix.passes.fold_constants import FoldConstants
from graphfix.passes.fold_reshape_targets import FoldReshapeTargets
from graphfix.passes.fuse_conv_bias import FuseConvBias
from graphfix.passes.fuse_conv_mul import FuseConvMul
from graphfix.passes.fuse_pad_conv import FusePadConv
from graphfix.passes.int64_to_int32 import Int64ToInt32
from graphfix.passes.lower_unsupported import LowerUnsupported
from graphfix.passes.merge_duplicates import MergeDuplicates
from graphfix.passes.migrate_plugins import MigratePlugins
from graphfix.passes.nms_for_trt import NmsForTrt
from graphfix.passes.nms_to_plugin import NmsToPlugin
from graphfix.passes.normalize_activations import NormalizeActivations
from graphfix.passes.opset import Opset
from graphfix.passes.plugin_to_nms import PluginToNms
from graphfix.passes.split_nms import SplitNms
from graphfix.passes.substitute_plugins import SubstitutePlugins
from graphfix.passes.unfuse_contrib import UnfuseContrib

PASSES: tuple[type[Pass], ...] = (
    Cleanup,
    FoldConstants,
    FoldReshapeTargets,
    FoldBatchNorm,
    FixShapes,
    EliminateNoops,
    FuseConvMul,
    FuseConvBias,
    FusePadConv,
    NormalizeActivations,
    DedupConstants,
    MergeDuplicates,
    UnfuseContrib,
    DetectUnsupported,
    LowerUnsupported,
    Int64ToInt32,
    Opset,
    BoundNms,
    SplitNms,
    PluginToNms,
    MigratePlugins,
    AddNms,
    NmsToPlugin,
    NmsForTrt,
    SubstitutePlugins,
)

# A suggestion must share this much of the name (difflib ratio): "fold-nb" gets
# "fold-bn" (0.86), "frob" gets the list of passes instead of "fold-bn" (0.55).
SUGGEST_CUTOFF = 0.75


@dataclass(frozen=True)
class Preset:
    """A named pipeline of passes, repeated until a round changes nothing (at most
    `max_rounds` rounds, a safety bound the report names when it is hit). Written in
    pipeline text by its name alone."""

    name: str
    summary: str
    passes: tuple[str, ...]
    max_rounds: int = 1


PRESETS: tuple[Preset, ...] = (
    Preset(
        "trt-prep",
        "Make Conv -> bias -> activation chains fusible for TensorRT: unfuse contrib ops, "
        "remove no-ops, fold BatchNorm/Mul/Add/Pad into convs, normalize activations, "
        "share repeated constants and expressions.",
        (
            "cleanup",
            "fold-constants",
            "fold-reshape-targets",
            "unfuse-contrib",
            "eliminate-noops",
            "fold-bn",
            "fuse-conv-mul",
            "fuse-conv-bias",
            "fuse-pad-conv",
            "normalize-activations",
            "dedup-constants",
            "merge-duplicates",
            "cleanup",
        ),
        # a fixed point, so a second `graphfix run` on the output changes nothing; real
        # exports reach it in 2-3 rounds (bench/RESULTS.md, zoo), the bound only stops a
        # pair of passes that would undo each other forever
        max_rounds=32,
    ),
)

DEFAULT_PIPELINE = _DEFAULT  # defined in passes/defaults.py (light, for the CLI)


def build_registry(classes: tuple[type[Pass], ...]) -> dict[str, type[Pass]]:
    """Name -> class; a duplicate or malformed pass is a programming error."""
    registry: dict[str, type[Pass]] = {}
    for cls in classes:
        check_pass_class(cls)
        if cls.name in registry:
            raise InternalError(
                f"two passes are named '{cls.name}': "
                f"{registry[cls.name].__qualname__} and {cls.__qualname__}"
            )
        registry[cls.name] = cls
    return registry


REGISTRY: dict[str, type[Pass]] = build_registry(PASSES)


def build_presets(
    presets: tuple[Preset, ...], registry: dict[str, type[Pass]]
) -> dict[str, Preset]:
    """Name -> preset; a name shared with a pass or another preset, or a preset naming an
    unknown pass, is a programming error."""
    found: dict[str, Preset] = {}
    for preset in presets:
        if preset.name in registry or preset.name in found:
            raise InternalError(f"preset '{preset.name}' reuses the name of a pass or preset")
        unknown = [p for p in preset.passes if p not in registry]
        if unknown or not preset.passes or preset.max_rounds < 1:
            raise InternalError(f"preset '{preset.name}' is malformed (unknown: {unknown})")
        found[preset.name] = preset
    return found


PRESET_REGISTRY: dict[str, Preset] = build_presets(PRESETS, REGISTRY)


def get_pass(name: str) -> type[Pass]:
    """The pass class named `name`; an unknown name is a user error with suggestions."""
    try:
        return REGISTRY[name]
    except KeyError:
        names = list(REGISTRY) + list(PRESET_REGISTRY)
        close = difflib.get_close_matches(name, names, n=3, cutoff=SUGGEST_CUTOFF)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        presets = f"; the presets are: {', '.join(PRESET_REGISTRY)}" if PRESET_REGISTRY else ""
        raise GraphfixError(
            f"Unknown pass '{name}'{hint}",
            f"the passes are: {', '.join(REGISTRY)}{presets}",
            "fix the name, or run `graphfix passes` to list every pass with its options",
        ) from None
