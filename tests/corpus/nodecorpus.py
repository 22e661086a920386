"""The ONNX backend node-test corpus through graphfix: one model per call, in worker processes.

The corpus is `onnx/backend/test/data/node/*` (model.onnx, test_data_set_0/input_*.pb,
output_*.pb). onnx wheels since 1.20 no longer ship it, so when the installed onnx lacks
it, `corpus_dir` writes it once with onnx's own generator (`onnx.backend.test.cmd_tools
generate-data`, numpy seeded: the same cases, the same layout) into a cache folder.

`run_case` is what one worker does with one model: `graphfix.api.run` (default pipeline,
output check on), the doctor's rules, and `graphfix check MODEL MODEL`; it returns an
`Outcome` (plain data, so it crosses processes). `run_all` runs many in parallel worker
processes, each with one onnxruntime thread and one BLAS thread.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

# The tolerances of the onnx backend node tests (onnx.backend.test.case.node.expect).
RTOL, ATOL = 1e-3, 1e-7
CASE_SECONDS = 300  # one model's limit: past it, the worker reports a hang

# Models graphfix cannot run yet, and why: input dtypes runtime/feeds.py cannot make
# (being added), read from the GraphfixError graphfix raises. Matched on its text.

OK, REFUSED, PENDING, FAILED = "ok", "refused", "pending", "failed"


@dataclass
class Outcome:
    """What graphfix did with one corpus model."""

    name: str
    status: str = OK
    problems: list[str] = field(default_factory=list)  # each a reason the test fails
    refused: str = ""  # the GraphfixError of a model graphfix declines (status REFUSED/PENDING)
    numerics: str = ""  # how the rewritten model's outputs were checked
    rolled_back: list[str] = field(default_factory=list)
    changed: bool = False
    seconds: float = 0.0
    ops: tuple[str, ...] = ()


def node_data_dir() -> Path | None:
    """The installed onnx's node-test folder, when its wheel ships one."""
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
    return path if path.is_dir() and any(path.iterdir()) else None


def corpus_dir(cache: Path) -> Path:
    """The corpus folder: onnx's own, or one generated into `cache` (once per onnx version;
    written to a temporary folder and renamed, so concurrent runs never see half of it)."""
    shipped = node_data_dir()
    if shipped is not None:
        return shipped
    target = cache / f"onnx-{onnx.__version__}" / "node"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="generating-", dir=target.parent))
    try:
        _generate(tmp)
        tmp.rename(target)
    except OSError:  # another run finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _generate(folder: Path) -> None:
    """onnx's node test cases as `generate-data` writes them (numpy seeded: the case
    generators draw their inputs unseeded)."""
    import warnings

    from onnx.backend.test.case import node

    state = np.random.get_state()
    np.random.seed(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cases = node.collect_testcases()
    finally:
        np.random.set_state(state)
    for case in cases:
        data = folder / case.name / "test_data_set_0"
        data.mkdir(parents=True)
        (folder / case.name / "model.onnx").write_bytes(case.model.SerializeToString())
        inputs, outputs = case.data_sets[0]
        graph = case.model.graph
        for prefix, values, infos in (("input", inputs, graph.input),
                                      ("output", outputs, graph.output)):
            for j, (value, vi) in enumerate(zip(values, infos, strict=False)):
                proto = _to_proto(value, vi)
                (data / f"{prefix}_{j}.pb").write_bytes(proto.SerializeToString())


def _to_proto(value, vi: onnx.ValueInfoProto):
    kind = vi.type.WhichOneof("value")
    if kind == "sequence_type":
        return numpy_helper.from_list(value, vi.name)
    if kind == "optional_type":
        return numpy_helper.from_optional(value, vi.name)
    if kind == "map_type":
        return numpy_helper.from_dict(value, vi.name)
    if isinstance(value, onnx.TensorProto):
        return value
    return numpy_helper.from_array(value, vi.name)


def case_names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if (p / "model.onnx").is_file())


def read_value(path: Path, type_proto: onnx.TypeProto):
    """A stored input/output as onnxruntime takes and gives it (array, list, dict, None)."""
    data = path.read_bytes()
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        proto = onnx.SequenceProto()
        proto.ParseFromString(data)
        return numpy_helper.to_list(proto)
    if kind == "optional_type":
        proto = onnx.OptionalProto()
        proto.ParseFromString(data)
        return numpy_helper.to_optional(proto)
    if kind == "map_type":
        proto = onnx.MapProto()
        proto.ParseFromString(data)
        return numpy_helper.to_dict(proto)
    proto = onnx.TensorProto()
    proto.ParseFromString(data)
    return numpy_helper.to_array(proto)


def stored_data(case: Path, model: onnx.ModelProto) -> tuple[dict, list]:
    """(feeds by input name, expected outputs in graph order) of test_data_set_0."""
    data = case / "test_data_set_0"
    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    feeds = {}
    for j, vi in enumerate(inputs):
        path = data / f"input_{j}.pb"
        if path.exists():
            feeds[vi.name] = read_value(path, vi.type)
    outputs = [read_value(data / f"output_{j}.pb", vi.type)
               for j, vi in enumerate(model.graph.output)
               if (data / f"output_{j}.pb").exists()]
    return feeds, outputs


def ort_outputs(model: onnx.ModelProto, feeds: dict) -> list:
    """onnxruntime's outputs (CPU, graph optimizations off, one thread)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 4
    sess = ort.InferenceSession(model.SerializeToString(), so, ["CPUExecutionProvider"])
    return sess.run(None, feeds)


def mismatch(got, want, path: str = "output") -> str | None:
    """Why `got` is not `want` at the backend tests' tolerances (None when it is)."""
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return f"{path}: a sequence of {len(want)} expected, got {type(got).__name__}"
        return next((m for i, (g, w) in enumerate(zip(got, want, strict=True))
                     if (m := mismatch(g, w, f"{path}[{i}]"))), None)
    if want is None or got is None:
        return None if want is None and got is None else f"{path}: {got!r} vs {want!r}"
    if isinstance(want, dict):
        return None if got == want else f"{path}: maps differ"
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"{path}: shape {got.shape}, expected {want.shape}"
    if want.dtype.kind in "fc" and want.dtype.itemsize > 1:  # float8 etc. compare as stored
        g, w = got.astype(np.float64), want.astype(np.float64)
        if np.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True):
            return None
        err = np.nanmax(np.abs(g - w)) if g.size else 0.0
        return f"{path}: max abs error {err:.3g} (rtol {RTOL:g}, atol {ATOL:g})"
    if want.dtype.kind == "O" or np.array_equal(got, want):
        return None if want.dtype.kind != "O" or got.tolist() == want.tolist() else \
            f"{path}: strings differ"
    return f"{path}: values differ"


def _numerics(case: Path, original: onnx.ModelProto, rewritten: onnx.ModelProto,
              outcome: Outcome) -> None:
    """The rewritten model against the stored outputs, or against onnxruntime's outputs on
    the original where onnxruntime disagrees with the stored ones."""
    feeds, stored = stored_data(case, original)
    try:
        reference = ort_outputs(original, feeds)
    except Exception as err:  # noqa: BLE001 - onnxruntime lacks the op, the type, ...
        outcome.numerics += f"not compared: onnxruntime cannot run the original ({_line(err)})"
        return
    against = "stored outputs"
    if len(stored) != len(reference) or mismatch(reference, stored) is not None:
        stored, against = reference, "onnxruntime on the original (it differs from the stored)"
    try:
        got = ort_outputs(rewritten, feeds)
    except Exception as err:  # noqa: BLE001
        outcome.problems.append(f"onnxruntime cannot run the rewritten model: {_line(err)}")
        return
    problem = mismatch(got, stored)
    if problem:
        outcome.problems.append(f"rewritten outputs differ from {against}: {problem}")
    outcome.numerics += f"matched {against}"


def _line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else ''}"


def _pending(model: onnx.ModelProto) -> bool:
    """Whether a refusal is for a model with sequence/optional inputs, which have no
    shape to make data for (every tensor dtype gets data: docs/inputs.md)."""
    return any(i.type.WhichOneof("value") != "tensor_type" for i in model.graph.input)


def run_case(case_dir: str) -> Outcome:
    """graphfix run, doctor and check on one corpus model (see the module docstring)."""
    from graphfix.errors import GraphfixError

    case = Path(case_dir)
    outcome = Outcome(case.name)
    start = time.perf_counter()
    model = onnx.load(str(case / "model.onnx"))
    outcome.ops = tuple(sorted({n.op_type for n in model.graph.node}))
    try:
        result = _run(model, case, outcome)
    except GraphfixError as err:
        outcome.refused = _line(err)
        outcome.status = PENDING if _pending(model) else REFUSED
    except Exception as err:  # noqa: BLE001 - every other exception is a graphfix bug
        outcome.problems.append(f"graphfix run raised {_line(err)}\n{traceback.format_exc()}")
    else:
        outcome.changed = any(p.status == "applied" for p in result.report.passes)
        outcome.rolled_back = [f"{p.spec}: {p.rollback_reason}"
                               for p in result.report.rolled_back]
        outcome.problems += [f"rolled back {r}" for r in outcome.rolled_back]
        try:
            onnx.checker.check_model(result.model)
        except Exception as err:  # noqa: BLE001
            outcome.problems.append(f"onnx.checker rejects the output: {_line(err)}")
        _numerics(case, model, result.model, outcome)
    _doctor(model, outcome)
    _check(model, outcome)
    if outcome.problems:
        outcome.status = FAILED
    outcome.seconds = time.perf_counter() - start
    return outcome


def _run(model: onnx.ModelProto, case: Path, outcome: Outcome):
    """`graphfix run MODEL`; where graphfix refuses to make inputs for it (an integer scalar
    it cannot guess, an input with no declared shape), again as its error says, with the
    test's stored inputs given as --input-value/--input-shape."""
    from graphfix.api import run
    from graphfix.errors import GraphfixError

    try:
        return run(model)
    except GraphfixError as err:
        feeds, _ = stored_data(case, model)
        shapes = {k: v.shape for k, v in feeds.items() if isinstance(v, np.ndarray)}
        arrays = {k: v for k, v in feeds.items()
                  if isinstance(v, np.ndarray) and v.dtype.kind in "iufb"}
        if not shapes:
            raise
        outcome.numerics = f"run with the stored inputs ({_line(err)[:120]}); "
        return run(model, input_values=arrays, input_shapes=shapes)


def _doctor(model: onnx.ModelProto, outcome: Outcome) -> None:
    from graphfix.doctor import diagnose
    from graphfix.trt import parse_target

    try:
        diagnosis = diagnose(model, parse_target(None))
    except Exception as err:  # noqa: BLE001
        outcome.problems.append(f"doctor raised {_line(err)}")
        return
    outcome.problems += [f"doctor: {f.message}" for f in diagnosis.findings
                         if f.rule == "internal"]


def _check(model: onnx.ModelProto, outcome: Outcome) -> None:
    """`graphfix check MODEL MODEL` (one random sample): a GraphfixError is the model's
    limit (its inputs), anything else a bug."""
    from graphfix.check.layerwise import compare_layerwise
    from graphfix.check.samples import check_samples
    from graphfix.errors import GraphfixError

    try:
        feeds = check_samples(model, None, None, {}, 1, 0)
        compare_layerwise(model, model, feeds)
    except GraphfixError as err:
        if outcome.status == OK:
            outcome.refused = outcome.refused or f"check: {_line(err)}"
    except Exception as err:  # noqa: BLE001
        outcome.problems.append(f"check raised {_line(err)}\n{traceback.format_exc()}")


def _alarm(signum, frame):
    raise TimeoutError(f"no result in {CASE_SECONDS} s")


def _guarded(case_dir: str) -> Outcome:
    """`run_case` under a time limit (a hang is reported, not waited for)."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        return run_case(case_dir)
    except TimeoutError as err:
        return Outcome(Path(case_dir).name, FAILED, [f"hang: {err}"])
    except Exception as err:  # noqa: BLE001 - reading the case, ...: reported, not lost
        return Outcome(Path(case_dir).name, FAILED,
                       [f"raised {_line(err)}\n{traceback.format_exc()}"])
    finally:
        signal.alarm(0)


def _bounded_worker() -> None:
    """One onnxruntime thread per session in this worker (graphfix's sessions too)."""
    import graphfix.runtime.session as session

    original = session.session_options

    def one_thread(*args, **kwargs):
        so = original(*args, **kwargs)
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        return so

    session.session_options = one_thread


_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def run_all(cases: Sequence[Path], workers: int | None = None,
            on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Every case in `workers` spawned processes (default: the CPUs this process may use)."""
    workers = workers or len(os.sched_getaffinity(0))
    saved = {k: os.environ.get(k) for k in _THREAD_ENV}
    os.environ.update({k: "1" for k in _THREAD_ENV})  # the workers inherit it
    try:
        with ProcessPoolExecutor(workers, get_context("spawn"),
                                 initializer=_bounded_worker) as pool:
            futures = [pool.submit(_guarded, str(c)) for c in cases]
            outcomes = []
            for future in as_completed(futures):
                outcomes.append(future.result())
                if on_done:
                    on_done(outcomes[-1])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return sorted(outcomes, key=lambda o: o.name)


def summary(outcomes: Iterable[Outcome], seconds: float) -> str:
    """The numbers the README quotes."""
    outcomes = list(outcomes)
    by = {s: [o for o in outcomes if o.status == s] for s in (OK, REFUSED, PENDING, FAILED)}
    times = sorted(o.seconds for o in outcomes) or [0.0]
    return (f"{len(outcomes)} models in {seconds:.0f} s: {len(by[OK])} passed, "
            f"{len(by[REFUSED])} refused, {len(by[PENDING])} pending, {len(by[FAILED])} failed; "
            f"per model median {times[len(times) // 2]:.2f} s, max {times[-1]:.1f} s")
