import json

from typer.testing import CliRunner

from graphfix.cli.app import app
from graphfix.passes.registry import DEFAULT_PIPELINE, PASSES

runner = CliRunner()


def test_passes_json_enumerates_the_registry():
    result = runner.invoke(app, ["passes", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert [p["name"] for p in data["passes"]] == [cls.name for cls in PASSES]
    assert data["default_pipeline"] == DEFAULT_PIPELINE
    fold = next(p for p in data["passes"] if p["name"] == "fold-constants")
    assert {"name": "size-threshold", "type": "int", "default": 16 * 1024 * 1024} in fold[
        "options"]
    fix = next(p for p in data["passes"] if p["name"] == "fix-shapes")
    assert "INPUT=DIMS" in fix["option_syntax"]


def test_passes_table_lists_every_pass():
    result = runner.invoke(app, ["passes"])
    assert result.exit_code == 0
    for cls in PASSES:
        assert cls.name in result.stdout
