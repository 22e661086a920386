"""The README stays true: its quick start is what CI runs, its pass table is the registry."""

import re
from pathlib import Path

from graphfix.passes.registry import PASSES, PRESETS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def quick_start() -> list[str]:
    block = README.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line for line in block.strip().splitlines() if line.strip()]


def test_quick_start_is_two_commands_and_ci_runs_the_second():
    demo, tests = quick_start()
    assert demo.endswith("graphfix demo")
    assert tests.endswith("pytest") and "'.[test]'" in tests
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_every_pass_and_preset_is_in_the_readme_table():
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", README, flags=re.M))
    assert listed == {cls.name for cls in PASSES} | {p.name for p in PRESETS}
