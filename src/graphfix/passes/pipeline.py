"""Pipeline text: `cleanup,fold-bn,fix-shapes{input=1x3x224x224}`.

Grammar: items separated by commas; an item is a pass name, optionally followed
by `{key=value,...}`, or the name of a preset (`trt-prep`), which runs its passes
in rounds until a round changes nothing. Whitespace around names, keys and values is ignored.
Printing a parsed pipeline gives back canonical text (no spaces), so
`str(parse_pipeline(text)) == text` for canonical text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from graphfix.errors import GraphfixError
from graphfix.passes.base import Pass
from graphfix.passes.registry import PRESET_REGISTRY, Preset, get_pass

_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
_KEY = re.compile(r"^[^\s=,{}]+$")


@dataclass(frozen=True)
class PassSpec:
    """One pipeline item: a pass name and its options as written."""

    name: str
    options: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        if not self.options:
            return self.name
        return self.name + "{" + ",".join(f"{k}={v}" for k, v in self.options) + "}"

    def build(self) -> Pass:
        """The configured pass; raises GraphfixError on an unknown name or bad option."""
        cls = get_pass(self.name)
        return cls(cls.parse_options(list(self.options)))


@dataclass(frozen=True)
class PresetSpec:
    """A preset named in a pipeline: its passes, run in rounds until nothing changes."""

    name: str

    def __str__(self) -> str:
        return self.name

    @property
    def preset(self) -> Preset:
        return PRESET_REGISTRY[self.name]

    def pass_specs(self) -> tuple[PassSpec, ...]:
        return tuple(PassSpec(name) for name in self.preset.passes)


Item = PassSpec | PresetSpec


@dataclass(frozen=True)
class Pipeline:
    specs: tuple[Item, ...]

    def __str__(self) -> str:
        return ",".join(str(s) for s in self.specs)

    def pass_specs(self) -> list[PassSpec]:
        """Every pass the pipeline runs (presets expanded, each round counted once)."""
        out: list[PassSpec] = []
        for item in self.specs:
            out.extend(item.pass_specs() if isinstance(item, PresetSpec) else (item,))
        return out


def parse_pipeline(text: str) -> Pipeline:
    """Parse pipeline text and validate every name and option (before any work runs)."""
    specs = []
    pos = 0
    text = text.strip()
    if not text:
        raise _syntax(text, 0, "the pipeline is empty")
    while pos < len(text):
        pos = _skip_ws(text, pos)
        m = _NAME.match(text, pos)
        if not m:
            raise _syntax(text, pos, "expected a pass name (lower-case, kebab-case)")
        name, pos = m.group(0), _skip_ws(text, m.end())
        options: tuple[tuple[str, str], ...] = ()
        if pos < len(text) and text[pos] == "{":
            end = text.find("}", pos)
            if end < 0:
                raise _syntax(text, pos, "'{' is never closed")
            options = _parse_options(text, pos + 1, end)
            pos = _skip_ws(text, end + 1)
        if name in PRESET_REGISTRY:
            if options:
                raise _syntax(text, pos, f"preset '{name}' takes no options")
            specs.append(PresetSpec(name))
        else:
            spec = PassSpec(name, options)
            spec.build()
            specs.append(spec)
        if pos < len(text):
            if text[pos] != ",":
                raise _syntax(text, pos, "expected ',' between passes")
            pos += 1
            if _skip_ws(text, pos) >= len(text):
                raise _syntax(text, pos, "the pipeline ends with ','")
    return Pipeline(tuple(specs))


def _parse_options(text: str, start: int, end: int) -> tuple[tuple[str, str], ...]:
    body = text[start:end]
    if "{" in body:
        raise _syntax(text, start + body.index("{"), "options cannot be nested")
    pairs = []
    seen = set()
    offset = start
    for item in body.split(","):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value or not _KEY.match(key):
            raise _syntax(text, offset, f"expected key=value, got '{item.strip()}'")
        if key in seen:
            raise _syntax(text, offset, f"option '{key}' is given twice")
        seen.add(key)
        pairs.append((key, value))
        offset += len(item) + 1
    return tuple(pairs)


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _syntax(text: str, pos: int, problem: str) -> GraphfixError:
    return GraphfixError(
        f"Cannot parse the pipeline '{text}' at character {pos + 1}",
        problem,
        "write passes separated by commas, options in braces: "
        "cleanup,fold-bn,fix-shapes{input=1x3x224x224} (see `graphfix passes`)",
    )
