"""One measured process, for every benchmark here: wall time from the parent, peak RSS
from GNU time (`time -f %M`), exit code, output.

Peak RSS is not taken from `os.wait4`'s ru_maxrss: a child forked from the benchmark
(Popen forks when it starts a new session) counts the parent's resident pages until it
execs, so every tool would read at least the benchmark process's own size (hundreds of
MiB once zoo models were inspected). GNU time forks the tool from its own small image.
Without it (not Linux), ru_maxrss is what there is.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

TIME = shutil.which("time", path="/usr/bin:/bin")


def run_measured(cmd: list[str], timeout: float, cwd: Path, env: dict[str, str]) -> dict:
    """Run `cmd` in a new session: {"e2e_s", "peak_kib", "rc", "timed_out", "stdout",
    "stderr"}; on timeout its whole process group is killed."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(suffix=".rss") as rss:
        if TIME:
            cmd = [TIME, "-f", "%M", "-o", rss.name, *cmd]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=cwd, env=env,
                                start_new_session=True)
        fired = threading.Event()

        def kill() -> None:
            fired.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        peak = usage.ru_maxrss
        if TIME:
            lines = Path(rss.name).read_text().strip().splitlines()
            peak = int(lines[-1]) if lines and lines[-1].isdigit() else peak
        return {"e2e_s": wall, "peak_kib": peak, "rc": os.waitstatus_to_exitcode(status),
                "timed_out": fired.is_set(), "stdout": out.read().decode(errors="replace"),
                "stderr": err.read().decode(errors="replace")}
