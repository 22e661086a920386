"""The one explicit list of passes. CLI help, docs and tests enumerate it.

A pass's module is imported when the pass is first looked up (`get_pass`, `REGISTRY[name]`),
not with this module: `graphfix run` with the default pipeline then loads the dozen passes
it runs, not the NMS, plugin and opset passes as well (43 ms of a 0.4 s start-up on 2
cores). `PASSES` (every class, in order) imports them all.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from importlib import import_module

from graphfix.errors import GraphfixError, InternalError
from graphfix.passes.base import Pass, check_pass_class
from graphfix.passes.defaults import DEFAULT_PIPELINE as _DEFAULT

_LISTED: tuple[tuple[str, str], ...] = (  # (name, module:class) in the order passes are shown
    ("cleanup", "cleanup:Cleanup"),
    ("inline-functions", "inline_functions:InlineFunctions"),
    ("fold-constants", "fold_constants:FoldConstants"),
    ("fold-reshape-targets", "fold_reshape_targets:FoldReshapeTargets"),
    ("unflatten-linear", "unflatten_linear:UnflattenLinear"),
    ("fold-bn", "fold_bn:FoldBatchNorm"),
    ("merge-parallel-convs", "merge_parallel_convs:MergeParallelConvs"),
    ("fix-shapes", "fix_shapes:FixShapes"),
    ("eliminate-noops", "eliminate_noops:EliminateNoops"),
    ("fuse-conv-mul", "fuse_conv_mul:FuseConvMul"),
    ("fuse-conv-bias", "fuse_conv_bias:FuseConvBias"),
    ("fuse-pad-conv", "fuse_pad_conv:FusePadConv"),
    ("normalize-activations", "normalize_activations:NormalizeActivations"),
    ("dedup-constants", "dedup_constants:DedupConstants"),
    ("merge-duplicates", "merge_duplicates:MergeDuplicates"),
    ("unfuse-contrib", "unfuse_contrib:UnfuseContrib"),
    ("detect-unsupported", "detect_unsupported:DetectUnsupported"),
    ("lower-unsupported", "lower_unsupported:LowerUnsupported"),
    ("int64-to-int32", "int64_to_int32:Int64ToInt32"),
    ("opset", "opset:Opset"),
    ("bound-nms", "bound_nms:BoundNms"),
    ("split-nms", "split_nms:SplitNms"),
    ("plugin-to-nms", "plugin_to_nms:PluginToNms"),
    ("migrate-plugins", "migrate_plugins:MigratePlugins"),
    ("add-nms", "add_nms:AddNms"),
    ("nms-to-plugin", "nms_to_plugin:NmsToPlugin"),
    ("nms-for-trt", "nms_for_trt:NmsForTrt"),
    ("substitute-plugins", "substitute_plugins:SubstitutePlugins"),
)


class LazyRegistry(MutableMapping[str, type[Pass]]):
    """Name -> pass class, each class imported from its `module:class` (in
    `graphfix.passes`) on first lookup and checked then: a malformed pass, or one whose
    `name` is not the name it is listed under, is a programming error. Iterating gives
    the names without importing anything. Classes can be set directly (tests)."""

    def __init__(self, listed: tuple[tuple[str, str], ...]) -> None:
        self._where: dict[str, str | type[Pass]] = {}
        for name, where in listed:
            if name in self._where:
                raise InternalError(f"two passes are named '{name}': {self._where[name]} "
                                    f"and {where}")
            self._where[name] = where
        self._loaded: dict[str, type[Pass]] = {}

    def __getitem__(self, name: str) -> type[Pass]:
        cls = self._loaded.get(name)
        if cls is None:
            where = self._where[name]
            if isinstance(where, str):
                module, _, attr = where.partition(":")
                cls = getattr(import_module(f"graphfix.passes.{module}"), attr)
            else:
                cls = where
            check_pass_class(cls)
            if cls.name != name:
                raise InternalError(f"pass {cls.__qualname__} is named '{cls.name}' but "
                                    f"listed as '{name}'")
            self._loaded[name] = cls
        return cls

    def __setitem__(self, name: str, cls: type[Pass]) -> None:
        self._where[name] = cls
        self._loaded.pop(name, None)

    def __delitem__(self, name: str) -> None:
        del self._where[name]
        self._loaded.pop(name, None)

    def __contains__(self, name: object) -> bool:  # without importing (Mapping's looks up)
        return name in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def __getattr__(name: str) -> object:
    if name == "PASSES":  # every pass class, in order: imports them all
        return tuple(REGISTRY[n] for n in REGISTRY)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        "Make Conv -> bias -> activation chains fusible for TensorRT: inline local "
        "functions, unfuse contrib ops, "
        "remove no-ops, fold BatchNorm/Mul/Add/Pad into convs, merge parallel convs of one "
        "input, normalize activations, "
        "share repeated constants and expressions.",
        (
            "inline-functions",
            "cleanup",
            "fold-constants",
            "fold-reshape-targets",
            "unflatten-linear",
            "unfuse-contrib",
            "eliminate-noops",
            "fold-bn",
            "merge-parallel-convs",
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
    Preset(
        "trt-tidy",
        "Tidy what the --trt passes wrote (lowerings, function bodies, the opset "
        "conversion): fold constants and reshape targets, remove no-ops, share repeated "
        "constants and expressions; nothing that would fuse a lowering back.",
        (
            "cleanup",
            "fold-constants",
            "fold-reshape-targets",
            "eliminate-noops",
            "dedup-constants",
            "merge-duplicates",
            "cleanup",
        ),
        max_rounds=32,  # a fixed point, as trt-prep
    ),
)

DEFAULT_PIPELINE = _DEFAULT  # defined in passes/defaults.py (light, for the CLI)


REGISTRY: LazyRegistry = LazyRegistry(_LISTED)


def build_presets(
    presets: tuple[Preset, ...], registry: MutableMapping[str, type[Pass]]
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
