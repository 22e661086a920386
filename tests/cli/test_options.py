"""One grammar: a flag two commands share means the same in both (cli/options.py), old
spellings are refused with the new one named, and help texts have no stray spaces."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import typer.main

from graphfix.cli import docgen
from graphfix.cli import options as opt
from graphfix.cli.app import app
from graphfix.cli.renamed import RENAMED, refuse_old_spellings
from graphfix.errors import GraphfixError


def _commands(group=None, prefix=""):
    group = group or typer.main.get_command(app)
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


COMMANDS = dict(_commands())


def _flags() -> dict[str, dict[str, tuple]]:
    """flag -> {command: (type, default, help, multiple, is_flag, metavar)}."""
    flags: dict[str, dict[str, tuple]] = {}
    for name, command in COMMANDS.items():
        for param in command.params:
            if param.param_type_name != "option" or param.hidden:
                continue
            described = (docgen.value_type(param), repr(param.default), param.help,
                         param.multiple, param.is_flag, param.metavar)
            for flag in param.opts:
                flags.setdefault(flag, {})[name] = described
    return flags


def test_the_four_commands_are_there():
    assert {"run", "doctor", "calibrate", "check"} <= set(COMMANDS)


@pytest.mark.parametrize("flag", sorted(f for f, by in _flags().items() if len(by) > 1))
def test_a_shared_flag_is_the_same_in_every_command(flag):
    by_command = _flags()[flag]
    first, *_ = by_command.values()
    differing = {c: d for c, d in by_command.items() if d != first}
    assert not differing, f"{flag} differs between commands: {by_command}"


def test_the_shared_groups_are_where_the_issue_wants_them():
    flags = _flags()
    for flag in ("--trt", "--providers", "--json", "--seed", "--input-shape", "--data"):
        assert {"run", "check"} <= set(flags[flag]), flag
    for flag in ("--trt", "--json", "--json-out"):
        assert {"doctor", "calibrate", "check"} <= set(flags[flag]), flag
    assert {"calibrate", "check"} <= set(flags["--samples"]) & set(flags["--html"])
    assert set(flags["--report"]) == {"run"}  # an output file, where it exists
    assert "--engine" in flags and "--trt-engine" in flags and "--run-report" in flags


def test_shared_flags_come_from_the_options_module():
    """Each option factory's flag is declared identically wherever it appears."""
    for factory in (opt.trt, opt.providers, opt.seed, opt.data, opt.as_json, opt.json_out,
                    opt.samples, opt.input_shape, opt.html, opt.fail_on, opt.memory_budget):
        info = factory()
        flag = next(d for d in info.param_decls if d.startswith("--"))
        for command, described in _flags()[flag].items():
            assert described[2] == info.help, (flag, command)
            assert described[1] == repr(info.default), (flag, command)


def test_help_texts_have_no_stray_spaces():
    for name, command in COMMANDS.items():
        for param in command.params:
            text = getattr(param, "help", None) or ""
            assert "  " not in text and not re.search(r"\s[.,;:](\s|$)", text), (name, text)


@pytest.mark.parametrize("renamed", RENAMED, ids=lambda r: f"{r.command} {r.flag}")
def test_an_old_spelling_names_the_new_one(renamed):
    value = {"--trt": [], "--json": ["r.json"], "--report": ["run.json"],
             "--max-samples": ["64"]}[renamed.flag]
    argv = [renamed.command, "a.onnx", "b.onnx", renamed.flag, *value]
    with pytest.raises(GraphfixError) as err:
        refuse_old_spellings(argv)
    message = err.value.message.lower()
    assert err.value.fix.lower() in message and "spelling changed" in message


def test_current_spellings_pass():
    for argv in (["check", "a.onnx", "b.onnx", "--trt", "10"], ["check", "a", "b", "--json"],
                 ["check", "a", "b", "--json", "--samples", "2"], ["doctor", "m", "--trt"],
                 ["run", "m", "--report", "r.json"], ["--debug", "check", "a", "--trt", "8.6"]):
        refuse_old_spellings(argv)


def test_the_console_script_refuses_an_old_spelling_with_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-c", "from graphfix.cli.app import main; main()",
                           "check", "a.onnx", "b.onnx", "--trt"], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert "--trt-engine" in done.stderr and done.stderr.startswith("error: ")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_rendered_help_has_no_stray_spaces(command):
    """typer takes `[default: ...]` out of a help text and leaves its space behind
    ("Where to write the result ."): help texts say "(default: ...)" instead."""
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [*command.split(), "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert not re.search(r"\w \.(\s|$)", text), re.search(r".{40}\w \.(\s|$)", text)


def test_the_console_script_relaxes_the_cyclic_gc(tmp_path):
    """graphfix's CLI sets GC thresholds for its own process (cli/app.py GC_THRESHOLDS);
    importing graphfix as a library leaves the interpreter's alone."""
    from graphfix.cli.app import GC_THRESHOLDS

    code = ("import gc, sys; before = gc.get_threshold(); import graphfix.cli.app as a; "
            "assert gc.get_threshold() == before; sys.argv = ['graphfix', '--version']\n"
            "try:\n    a.main()\nexcept SystemExit:\n    pass\nprint(gc.get_threshold())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(GC_THRESHOLDS)
