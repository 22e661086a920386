"""A staged file's pages are handed to the disk while it is written (`staging._Writeback`):
each range once, in order, the file's bytes unchanged, nothing left running after."""

from __future__ import annotations

import os
import threading

import pytest

from graphfix import staging

STEP = staging.WRITEBACK_BYTES


class Recorder:
    """sync_file_range's stand-in: records (offset, nbytes, flags), signals each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.called = threading.Event()

    def __call__(self, fd: int, offset: int, nbytes: int, flags: int) -> int:
        assert os.fstat(fd).st_size >= offset + nbytes
        self.calls.append((offset, nbytes, flags))
        self.called.set()
        return 0


def _writer(recorder: Recorder, parts: int, fail: bool = False):
    def write(f) -> None:
        for i in range(parts):
            recorder.called.clear()
            f.write(bytes([i]) * STEP)
            f.flush()
            assert recorder.called.wait(10), "no writeback asked for the part just written"
        f.write(b"tail")  # under WRITEBACK_BYTES: left to the fsync
        if fail:
            raise OSError(28, "No space left on device")
    return write


def _writeback_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "graphfix-writeback"]


def test_each_part_is_handed_to_the_disk_once_in_order(tmp_path, monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(staging, "_sync_file_range", lambda: recorder)
    target = str(tmp_path / "out.bin")
    staging.publish(staging.stage(target, [(target, _writer(recorder, 3))]))
    assert recorder.calls == [(0, STEP, 2), (STEP, STEP, 2), (2 * STEP, STEP, 2)]
    with open(target, "rb") as f:
        data = f.read()
    assert data == b"".join(bytes([i]) * STEP for i in range(3)) + b"tail"
    assert _writeback_threads() == []


def test_a_failing_writer_leaves_no_thread_and_no_file(tmp_path, monkeypatch):
    from graphfix.errors import GraphfixError

    recorder = Recorder()
    monkeypatch.setattr(staging, "_sync_file_range", lambda: recorder)
    target = str(tmp_path / "out.bin")
    with pytest.raises(GraphfixError, match="No space left"):
        staging.stage(target, [(target, _writer(recorder, 1, fail=True))])
    assert _writeback_threads() == []
    assert os.listdir(tmp_path) == []


def test_without_the_call_nothing_runs_beside_the_writer(tmp_path, monkeypatch):
    monkeypatch.setattr(staging, "_sync_file_range", lambda: None)
    seen = []
    target = str(tmp_path / "out.bin")

    def write(f) -> None:
        f.write(b"x" * (2 * STEP))
        seen.extend(_writeback_threads())

    staging.publish(staging.stage(target, [(target, write)]))
    assert seen == [] and os.path.getsize(target) == 2 * STEP


@pytest.mark.skipif(staging._sync_file_range() is None, reason="no sync_file_range here")
def test_the_real_call_takes_a_file_being_written(tmp_path):
    target = str(tmp_path / "out.bin")
    staging.publish(staging.stage(target, [(target, lambda f: f.write(b"y" * (3 * STEP)))]))
    assert os.path.getsize(target) == 3 * STEP
    fd = os.open(target, os.O_RDONLY)
    try:
        assert staging._sync_file_range()(fd, 0, STEP, 2) == 0
    finally:
        os.close(fd)
