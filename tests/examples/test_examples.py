"""Every examples/NN_*/README.md runs as written: its bash-block commands, in order, in a
copy of the folder, with the exit codes it states, and it writes the files it names.

The README conventions (examples/README.md): one command per line in ```bash blocks,
`#` lines are comments, a trailing `# exits N` marks an expected non-zero exit code, and
one `Produces: a.onnx, b.json` line lists the files the commands must write.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FOLDER = re.compile(r"^(\d\d)_[a-z0-9_]+$")
BLOCK = re.compile(r"^```bash[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
EXITS = re.compile(r"#\s*exits\s+(\d+)\s*$")
PRODUCES = re.compile(r"^Produces:(.*)$", re.M)
TIMEOUT_S = 120
TAIL_CHARS = 3000


@dataclass(frozen=True)
class Command:
    line: str
    exit_code: int


@dataclass(frozen=True)
class Example:
    folder: Path
    commands: list[Command]
    produces: list[str]


def example_folders() -> list[Path]:
    return sorted(p for p in EXAMPLES.iterdir() if p.is_dir() and FOLDER.match(p.name))


def parse(folder: Path) -> Example:
    """The commands and the produced files one example's README states."""
    text = (folder / "README.md").read_text()
    commands = []
    for block in BLOCK.findall(text):
        for raw in block.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            assert not line.endswith("\\"), f"{folder.name}: one command per line: {line}"
            marked = EXITS.search(line)
            commands.append(Command(line, int(marked.group(1)) if marked else 0))
    produces = PRODUCES.findall(text)
    assert len(produces) == 1, f"{folder.name}/README.md needs exactly one 'Produces:' line"
    files = [name.strip() for name in produces[0].split(",") if name.strip()]
    return Example(folder, commands, files)


def tail(text: str) -> str:
    return text[-TAIL_CHARS:] if len(text) > TAIL_CHARS else text


def test_examples_are_numbered_from_01_without_gaps():
    numbers = [int(FOLDER.match(p.name).group(1)) for p in example_folders()]
    assert len(numbers) >= 5, f"expected at least 5 examples in {EXAMPLES}, found {numbers}"
    assert numbers == list(range(1, len(numbers) + 1))
    index = (EXAMPLES / "README.md").read_text()
    for folder in example_folders():
        assert f"({folder.name}/)" in index, f"examples/README.md does not link {folder.name}"


@pytest.mark.parametrize("folder", example_folders(), ids=lambda p: p.name)
def test_example_readme_runs(folder: Path, tmp_path: Path):
    example = parse(folder)
    assert example.commands, f"{folder.name}/README.md has no ```bash commands"
    assert example.produces, f"{folder.name}/README.md's 'Produces:' line names no file"
    shipped = [name for name in example.produces if (folder / name).exists()]
    assert not shipped, f"{folder.name} ships files its commands should write: {shipped}"

    work = tmp_path / folder.name
    shutil.copytree(folder, work, ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for i, command in enumerate(example.commands, 1):
        done = subprocess.run(command.line, shell=True, cwd=work, env=env, text=True,
                              capture_output=True, timeout=TIMEOUT_S)
        assert done.returncode == command.exit_code, (
            f"{folder.name}, command {i}: {command.line}\n"
            f"exit code {done.returncode}, expected {command.exit_code}\n"
            f"--- stdout (tail) ---\n{tail(done.stdout)}\n"
            f"--- stderr (tail) ---\n{tail(done.stderr)}"
        )

    for name in example.produces:
        path = work / name
        assert path.is_file(), f"{folder.name}: 'Produces:' names {name}, which was not written"
        assert path.stat().st_size > 0, f"{folder.name}: {name} is empty"
        if name.endswith(".onnx"):
            onnx.checker.check_model(str(path))
