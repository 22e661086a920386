"""docs/cli/ stays true: one page per command, its generated section what the code makes
now, its JSON tables the keys real results have, its exit codes those the code uses."""

from __future__ import annotations

import inspect
import json
import pkgutil
import re
import shutil

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import graphfix
from graphfix import samples
from graphfix.cli import common, docgen
from graphfix.cli.app import app
from graphfix.cli.docdata import EXITS, SCHEMAS
from graphfix.nms.compare import Detections, compare_detections

COMMANDS = docgen.commands()
EXIT_CONSTANTS = {v for k, v in vars(common).items() if k.startswith("EXIT_")}


def _page(name: str) -> str:
    return (docgen.DOCS / f"{name}.md").read_text(encoding="utf-8")


def test_every_page_matches_the_code():
    problems = docgen.stale()
    assert not problems, "\n\n".join(problems)


def test_a_page_edited_by_hand_is_reported_and_rewritten(tmp_path):
    docs = tmp_path / "cli"
    shutil.copytree(docgen.DOCS, docs)
    page = docs / "run.md"
    text = page.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `--strict` |"))
    page.write_text(text.replace(row + "\n", ""), encoding="utf-8")
    problems = docgen.stale(docs)
    assert len(problems) == 1 and problems[0].startswith("docs/cli/run.md is out of date")
    assert "python -m graphfix.cli.docgen" in problems[0] and "--strict" in problems[0]
    assert docgen.write(docs) == [page] and docgen.stale(docs) == []
    assert page.read_text(encoding="utf-8") == text


def test_generation_is_deterministic_and_has_no_local_paths():
    first, second = docgen.generated(), docgen.generated()
    assert first == second
    text = "".join(first.values())
    assert str(docgen.DOCS.parents[1]) not in text and "/tmp" not in text


def test_every_command_has_a_page_the_index_links():
    index = (docgen.DOCS / docgen.INDEX).read_text(encoding="utf-8")
    for name in COMMANDS:
        head = _page(name).split(docgen.START)[0]
        assert head.startswith(f"# `graphfix {name}`"), name
        assert "```bash" in head and "From Python" in head, f"{name}.md: examples, Python"
        assert f"]({name}.md)" in index.split(docgen.START)[0], f"the index's intro: {name}"
        assert f"]({name}.md)" in index.split(docgen.START)[1], f"the index's table: {name}"
    pages = {p.stem for p in docgen.DOCS.glob("*.md")} - {"README"}
    assert pages == set(COMMANDS), "a page for a command the app no longer has"
    assert set(EXITS) == set(SCHEMAS) == set(COMMANDS)


def test_the_readme_usage_links_every_page():
    readme = (docgen.DOCS.parents[1] / "README.md").read_text(encoding="utf-8")
    usage = readme.split("## Usage", 1)[1].split("\n## ", 1)[0]
    for name in [*COMMANDS, "README"]:
        assert f"(docs/cli/{name}.md)" in usage, name


# -- exit codes --------------------------------------------------------------------------

def _exit_table(name: str) -> dict[int, str]:
    section = _page(name).split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return {int(code): when.strip()
            for code, when in re.findall(r"^\| (\d+) \|(.*)\|$", section, flags=re.M)}


def _exits_1(name: str) -> bool:
    """Whether the command's code raises EXIT_FAILED (read from its modules' source)."""
    leaves = [leaf for _, leaf in docgen.leaves(name, COMMANDS[name])]
    return any("EXIT_FAILED" in inspect.getsource(inspect.getmodule(leaf.callback))
               for leaf in leaves)


def test_every_exit_constant_is_documented():
    listed = set().union(*(_exit_table(name) for name in COMMANDS))
    assert EXIT_CONSTANTS <= listed and listed <= EXIT_CONSTANTS | {0}


@pytest.mark.parametrize("name", COMMANDS)
def test_a_page_lists_0_2_3_and_says_when_it_exits_1(name):
    table = _exit_table(name)
    assert {0, common.EXIT_USER_ERROR, common.EXIT_INTERNAL} <= set(table)
    assert all(table.values())
    if _exits_1(name):
        assert len(table.get(common.EXIT_FAILED, "")) > 20, f"{name}: when does it exit 1?"
    else:
        assert common.EXIT_FAILED not in table, f"{name} never exits {common.EXIT_FAILED}"


# -- JSON keys ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[tuple[str, str], list[tuple[dict, set[str]]]]:
    """Per (command, the flag that picks the JSON): real results' JSON, each with the
    flags it was made with."""
    tmp = tmp_path_factory.mktemp("docs")
    model = samples.conv_bn_relu_residual()
    path = tmp / "model.onnx"
    onnx.save(model, path)
    (name, shape), = [(i.name, [d.dim_value or 4 for d in i.type.tensor_type.shape.dim])
                      for i in model.graph.input]
    data = tmp / "calib.npz"
    np.savez(data, **{name: np.random.default_rng(0).standard_normal(shape).astype("float32")})
    cache = tmp / "calib.cache"
    box = Detections.of([[0, 0, 10, 10]], [0.9], [1])
    cli = CliRunner()
    return {
        ("run", ""): [(graphfix.run(model, passes="cleanup,fold-bn", trt="10",
                                    explain=True).to_json(), {"--trt", "--explain"})],
        ("run", "--bisect"): [(graphfix.bisect(model, "cleanup,fold-bn").to_json(), set())],
        ("doctor", ""): [(graphfix.doctor(model, trt="10").to_json(), {"--trt"})],
        ("check", ""): [(graphfix.check(model, model, trt="10").to_json(), {"--trt"}),
                        (graphfix.check(model, model).to_json(), set())],
        ("check", "--detections"): [(compare_detections([box], [box]).to_json(), set())],
        ("calibrate", ""): [(graphfix.calibrate(path, data=data, method="minmax",
                                                cache=cache).to_json(), {"--cache"})],
        ("calibrate", "--from-cache"): [(graphfix.calibrate(path, from_cache=cache).to_json(),
                                         set())],
        ("passes", ""): [(json.loads(cli.invoke(app, ["passes", "--json"]).stdout), set())],
        ("plugins", ""): [(json.loads(cli.invoke(app, ["plugins", "list", "--json"]).stdout),
                           set())],
    }


DOCUMENTED = [(name, schema) for name, schemas in SCHEMAS.items() for schema in schemas]


@pytest.mark.parametrize("name", COMMANDS)
def test_a_command_with_json_has_a_json_table(name):
    prints = any("--json" in p.opts for _, leaf in docgen.leaves(name, COMMANDS[name])
                 for p in leaf.params)
    assert prints == bool(SCHEMAS[name])
    assert prints == ("\n## JSON\n" in _page(name))


def test_every_json_table_is_checked_here(results):
    assert set(results) == {(name, s.when) for name, s in DOCUMENTED}


@pytest.mark.parametrize(("name", "schema"), DOCUMENTED,
                         ids=[f"{n}{s.when}" for n, s in DOCUMENTED])
def test_a_json_table_names_exactly_the_keys_of_a_real_result(results, name, schema):
    assert pkgutil.resolve_name(schema.source), schema.source
    for real, flags in results[(name, schema.when)]:
        documented = {k.name for k in schema.keys if not k.only or k.only in flags}
        assert real.get("schema", "") == schema.name
        assert not set(real) - documented, f"graphfix {name}: undocumented keys"
        assert not documented - set(real), f"graphfix {name}: documented keys it lacks"


def test_the_module_checks_and_refuses_other_arguments(capsys):
    assert docgen.main(["--check"]) == 0
    assert docgen.main(["--chek"]) == 2 and "usage" in capsys.readouterr().err
