"""The noise floor of a selecting model, measured ahead in the background while the
passes run, on a machine with cores to spare: used only when a check fails without it,
stopped when a check passes without it, and never measured ahead once someone waits
for the original."""

from __future__ import annotations

import threading
import time

import pytest
from gfhelpers import parse

from graphfix.runtime import outputs

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'


def model(select: str = "ArgMax"):
    return parse(HEADER + f"""
    g (float[1,8] x) => (float[1,8] y, int64[1] label) {{
        y = Relu(x)
        label = {select} <axis = 1, keepdims = 0> (x)
    }}""")


class Runs:
    """onnxruntime's runs, the floor's (optimized) run flipping the label as near-tied
    scores do; `hold` keeps the floor's run going until it is stopped, `slow_original`
    delays the original's."""

    def __init__(self, monkeypatch, hold: bool = False, slow_original: float = 0.0):
        self.basic: list[threading.Thread] = []
        self.plain = 0
        self.floor_done = threading.Event()
        self.stopped = False
        real = outputs.run_checkable

        def run(m, feeds, providers=("cpu",), basic=False, extra_outputs=(), run_options=None):
            if not basic:
                self.plain += 1
                if self.plain == 1:
                    time.sleep(slow_original)
                return real(m, feeds, providers, basic, extra_outputs)
            self.basic.append(threading.current_thread())
            try:
                if hold and len(self.basic) == 1:
                    deadline = time.monotonic() + 30
                    while not (run_options is not None and run_options.terminate):
                        assert time.monotonic() < deadline, "the floor's run was not stopped"
                        time.sleep(0.005)
                    self.stopped = True
                    raise RuntimeError("Exiting due to terminate flag being set to true.")
                result = real(m, feeds, providers, basic, extra_outputs, run_options)
                result["label"] = result["label"] + 1
                return result
            finally:
                self.floor_done.set()

        monkeypatch.setattr(outputs, "run_checkable", run)


@pytest.fixture(autouse=True)
def spare_cores(monkeypatch):
    """The floor runs ahead only with cores to spare: as if there were 4."""
    monkeypatch.setattr(outputs, "intra_op_threads", lambda: outputs.AHEAD_MIN_CPUS)


def prepare() -> outputs.OutputCheck:
    return outputs.OutputCheck.prepare(model(), {"x": (1, 8)}, background=True)


def test_a_check_that_passes_without_the_floor_ignores_the_one_measured_ahead(monkeypatch):
    runs = Runs(monkeypatch)
    check = prepare()
    assert runs.floor_done.wait(30)  # measured ahead: nobody waited for the original
    assert [t.name for t in runs.basic] == ["graphfix-floor"]
    outcome = check.verify(model())
    assert outcome.ok and outcome.describe() == "passed (exact)"  # the label judged too
    assert check.unjudged == {} and not check.floor_measured
    check.close()


def test_a_check_that_fails_without_it_takes_the_floor_measured_ahead(monkeypatch):
    runs = Runs(monkeypatch)
    check = prepare()
    assert runs.floor_done.wait(30)
    outcome = check.verify(model(select="ArgMin"))
    assert len(runs.basic) == 1  # not measured again
    assert outcome.ok and check.floor_measured
    assert list(check.unjudged) == ["label"]
    assert outcome.describe() == ("passed (exact; not compared, ill-conditioned on this "
                                  "sample: label)")


def test_a_floor_still_running_is_stopped_when_a_check_passes_without_it(monkeypatch):
    runs = Runs(monkeypatch, hold=True)
    check = prepare()
    deadline = time.monotonic() + 30
    while not runs.basic:  # the floor's run has started
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert check.verify(model()).ok
    assert runs.stopped and not runs.basic[0].is_alive()
    assert not check.floor_measured
    # a later check that needs the floor measures it
    outcome = check.verify(model(select="ArgMin"))
    assert len(runs.basic) == 2 and runs.basic[1] is threading.current_thread()
    assert outcome.ok and list(check.unjudged) == ["label"]


def test_close_stops_a_floor_still_running(monkeypatch):
    runs = Runs(monkeypatch, hold=True)
    check = prepare()
    deadline = time.monotonic() + 30
    while not runs.basic:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    check.close()
    assert runs.stopped and not runs.basic[0].is_alive()
    outcome = check.verify(model(select="ArgMin"))  # measured now, in this thread
    assert len(runs.basic) == 2 and outcome.ok and list(check.unjudged) == ["label"]


def test_no_floor_runs_ahead_once_a_caller_waits_for_the_original(monkeypatch):
    runs = Runs(monkeypatch, slow_original=0.3)
    check = prepare()
    assert check.reference is not None  # waits: the passes are done
    assert check.verify(model()).ok
    assert runs.basic == [] and not check.floor_measured


def test_with_fewer_cores_nothing_runs_ahead(monkeypatch):
    runs = Runs(monkeypatch)
    monkeypatch.setattr(outputs, "intra_op_threads", lambda: outputs.AHEAD_MIN_CPUS - 1)
    check = prepare()
    time.sleep(0.2)
    assert runs.basic == []
    assert check.verify(model(select="ArgMin")).ok  # measured when the check needs it
    assert runs.basic == [threading.current_thread()]


def test_a_model_without_a_selection_measures_nothing_ahead(monkeypatch):
    runs = Runs(monkeypatch)
    plain = parse(HEADER + """
    g (float[1,8] x) => (float[1,8] y) {
        y = Relu(x)
    }""")
    check = outputs.OutputCheck.prepare(plain, {"x": (1, 8)}, background=True)
    time.sleep(0.2)
    assert check.verify(plain).ok and runs.basic == []


def test_a_run_leaves_no_floor_running_behind(monkeypatch):
    import graphfix

    runs = Runs(monkeypatch, hold=True)

    def floor_started(index, spec):  # the passes run on until the floor runs ahead
        deadline = time.monotonic() + 30
        while not runs.basic:
            assert time.monotonic() < deadline
            time.sleep(0.005)

    result = graphfix.run(model(), passes="cleanup", input_shapes={"x": (1, 8)},
                          on_pass_start=floor_started)
    assert result.report.check.enabled
    assert runs.stopped and not runs.basic[0].is_alive()
    assert not any(t.name == "graphfix-floor" for t in threading.enumerate())
