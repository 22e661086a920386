"""`graphfix passes`: every registered pass, its summary and options."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rich.table import Table

from graphfix.cli import options as opt
from graphfix.cli.common import console


def describe(cls) -> dict[str, Any]:
    """A pass as data: name, summary, options (name, type, default) or their syntax."""
    syntax = getattr(cls, "option_syntax", None)
    options = [] if syntax else [
        {
            "name": f.name.replace("_", "-"),
            "type": f.type if isinstance(f.type, str) else f.type.__name__,
            "default": f.default if f.default is not dataclasses.MISSING else None,
        }
        for f in cls.option_fields()
    ]
    return {"name": cls.name, "summary": cls.summary, "options": options,
            "option_syntax": syntax or ""}


def passes_command(
    as_json: bool = opt.as_json(),
) -> None:
    """List every pass and preset with its summary and options."""
    from graphfix.passes.registry import DEFAULT_PIPELINE, PASSES, PRESETS

    described = [describe(cls) for cls in PASSES]
    presets = [{"name": p.name, "summary": p.summary, "passes": list(p.passes),
                "max_rounds": p.max_rounds} for p in PRESETS]
    if as_json:
        print(json.dumps({"default_pipeline": DEFAULT_PIPELINE, "passes": described,
                          "presets": presets}, indent=2))
        return
    table = Table(title="graphfix passes", title_justify="left")
    table.add_column("pass")
    table.add_column("what it does")
    table.add_column("options")
    for d in described:
        opts = d["option_syntax"] or ", ".join(
            f"{o['name']}={_fmt(o['default'])} ({o['type']})" for o in d["options"]
        )
        table.add_row(d["name"], d["summary"], opts or "-")
    for p in presets:
        table.add_row(p["name"], f"preset: {p['summary']}",
                      f"runs {','.join(p['passes'])} up to {p['max_rounds']} rounds")
    console.print(table)
    console.print(f"default pipeline: {DEFAULT_PIPELINE}", markup=False)


def _fmt(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
