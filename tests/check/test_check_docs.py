"""docs/check.md's JSON example has exactly the keys `graphfix check --json` writes."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from test_layerwise import chain, perturb, samples

from graphfix.check._origins import Origin
from graphfix.check.layerwise import SCHEMA, TensorResult, compare_layerwise

DOC = Path(__file__).resolve().parents[2] / "docs" / "check.md"


def documented() -> dict:
    text = DOC.read_text()
    section = text.split(f"schema `{SCHEMA}`)", 1)[1]
    return json.loads(section.split("```json", 1)[1].split("```", 1)[0])


def test_documented_json_has_the_keys_the_report_writes():
    ref = chain(3)
    data = compare_layerwise(ref, perturb(ref, "w2"), samples(ref, 2)).to_json()
    doc = documented()
    assert list(doc) == list(data)
    assert doc["schema"] == SCHEMA
    tensor_keys = [f.name for f in fields(TensorResult)]
    assert list(doc["first_divergence"]) == tensor_keys == list(data["tensors"][0])
    assert list(doc["origins"][0]) == [f.name for f in fields(Origin)] == list(data["origins"][0])
