"""Running the two models with their shared tensors exposed, chunk by chunk.

For each group of samples (`_inline`), the reference's main-graph tensors are matched
to the candidate's (through `renamed`), split into chunks whose activations fit the
memory budget (`runtime.expose.activation_bytes`, per tensor the larger of the two
models' estimates), and each chunk runs once per sample in each model with only its
tensors as graph outputs. Every pair is reduced to numbers (`_measure.Tally`) as soon
as both runs of a sample are done, so at most one chunk's activations of each model
are alive at a time: a run holds no more than the budget of exposed activations
(a tensor larger than the budget runs alone, and a note says so). Graph inputs come
from the feeds and candidate initializers (a tensor a pass folded to a constant) from
the model, without a run.

Runs go through one runner interface (`infer(feeds) -> {name: array}`): onnxruntime
sessions with `runtime.session`'s options, and with `engine` (`check.engine`) the
candidate is a TensorRT engine under polygraphy's `TrtRunner`. The candidate model
then only names the tensors (and reads If conditions); a pair whose candidate tensor
the engine does not expose gets the engine's status ("fused by TensorRT") instead of
a run. The engine returns all its debug tensors on every run, so the memory budget
bounds the reference's runs and what graphfix keeps of the engine's, not what
TensorRT copies to the host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper

from graphfix import weights
from graphfix.check._inline import Group
from graphfix.check.status import TensorStatus
from graphfix.errors import GraphfixError, said
from graphfix.runtime.expose import (
    activation_bytes,
    chunk_tensors,
    exposed_session,
    infer_tensor_info,
)
from graphfix.runtime.measure import Tally, common_dtype
from graphfix.runtime.outputs import feeds_as_declared
from graphfix.runtime.tolerances import Tolerance

if TYPE_CHECKING:
    from graphfix.check.engine import TrtEngine

Progress = Callable[[str, int, int], None]


def model_feeds(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                renamed: Mapping[str, str]) -> dict[str, np.ndarray]:
    """The feeds `model` takes: its inputs by name (or by the reference name they were
    renamed from), cast to the dtype it declares when that keeps the values."""
    back = {new: old for old, new in renamed.items()}
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        source = vi.name if vi.name in feeds else back.get(vi.name)
        if source in feeds:
            out[vi.name] = np.asarray(feeds[source])
        elif vi.name not in inits:
            raise GraphfixError(
                f"No data for input '{vi.name}' of the model",
                f"the inputs given are: {', '.join(sorted(feeds)) or 'none'}",
                "give one array per model input, keyed by the input's name",
            )
    return feeds_as_declared(model, out)


def run_error(which: str, err: Exception, model: onnx.ModelProto | None = None,
              feeds: Mapping[str, np.ndarray] | None = None) -> GraphfixError:
    """With the model and the feeds it failed on, the error names the input to blame
    where it can be told (`runtime.failures`) and how to give inputs it accepts."""
    if model is not None and feeds is not None:
        from graphfix.runtime.failures import explain

        why, fix = explain(model, feeds, err)
        return GraphfixError(f"onnxruntime cannot run the {which} model", f"it says: {why}",
                             fix)
    return GraphfixError(
        f"onnxruntime cannot run the {which} model", f"it says: {said(err)}",
        "a layer-wise check needs both models to run in onnxruntime; "
        "check that each runs on its own (graphfix doctor lists what it cannot)",
    )


class SessionCache:
    """Sessions with given outputs exposed, per model: used to read If conditions."""

    def __init__(self, samples: Sequence[Mapping[str, np.ndarray]],
                 renamed: Mapping[str, str], providers: Sequence[str]) -> None:
        self.samples, self.renamed, self.providers = samples, renamed, providers
        self._cache: dict[tuple[int, tuple[str, ...]], tuple[onnx.ModelProto, object]] = {}

    def __call__(self, model: onnx.ModelProto, names: list[str], sample: int,
                 which: str) -> list:
        """The named tensors of `model` on sample `sample` (graph inputs from the feeds)."""
        feeds = model_feeds(model, self.samples[sample], self.renamed)
        exposed = [n for n in names if n not in feeds]
        key = (id(model), tuple(exposed))
        if exposed and key not in self._cache:
            self._cache[key] = (model, _session(model, exposed, self.providers, which))
        values = _values(model, self._cache[key][1] if exposed else None, exposed,
                         self.samples[sample], self.renamed, which)
        return [values[n] for n in names]

    def close(self) -> None:
        for _, runner in self._cache.values():
            close_runner(runner)
        self._cache.clear()


@dataclass
class Plan:
    """What one group compares: pairs (reference -> candidate name), the status of the
    tensors it does not compare, and the chunks of pairs run together."""

    group: Group
    tensors: list[str]  # the reference's main-graph tensors (group's model)
    pairs: dict[str, str] = field(default_factory=dict)
    status: dict[str, tuple[TensorStatus, str]] = field(default_factory=dict)  # not compared
    dtypes: dict[str, str] = field(default_factory=dict)
    ref_inputs: set[str] = field(default_factory=set)
    cand_inputs: set[str] = field(default_factory=set)
    cand_consts: dict[str, onnx.TensorProto] = field(default_factory=dict)
    chunks: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def plan_group(group: Group, samples: Sequence[Mapping[str, np.ndarray]],
               renamed: Mapping[str, str], removed: Mapping[str, str],
               budget: int | None, engine: TrtEngine | None = None) -> Plan:
    """Match, classify and chunk the tensors of one group (module docstring)."""
    ref, cand = group.reference.model, group.candidate.model
    fed = set(samples[group.samples[0]])
    ref_feeds = model_feeds(ref, samples[group.samples[0]], {})
    cand_feeds = model_feeds(cand, samples[group.samples[0]], renamed)
    inits = {t.name for t in ref.graph.initializer}
    inputs = [vi.name for vi in ref.graph.input if vi.name not in inits or vi.name in fed]
    tensors = list(dict.fromkeys(inputs + [o for n in ref.graph.node for o in n.output if o]))
    plan = Plan(group, tensors, ref_inputs=set(inputs), cand_inputs=set(cand_feeds),
                notes=list(group.notes))
    plan.cand_consts = {t.name: t for t in cand.graph.initializer if t.name not in cand_feeds}
    cand_names = set(cand_feeds) | set(plan.cand_consts)
    cand_names |= {o for n in cand.graph.node for o in n.output if o}
    ref_info = infer_tensor_info(ref, ref_feeds)
    cand_info = infer_tensor_info(cand, cand_feeds)
    targets = _reshape_targets(cand, plan.cand_consts)
    for t in tensors:
        plan.dtypes[t] = _dtype_name(ref_info.get(t, (0, None))[0])
        other = renamed.get(t, t)
        if other not in cand_names:
            plan.status[t] = (TensorStatus.MERGED, removed[t]) if t in removed else \
                (TensorStatus.ONLY_IN_REFERENCE, "")
            continue
        why = _static_mismatch(ref_info.get(t, (0, None))[0], cand_info.get(other, (0, None))[0])
        if engine is not None and _cand_runs(plan, other) and other not in engine.exposed:
            plan.status[t] = (engine.status(other), "")
        elif other in targets:
            plan.status[t] = (TensorStatus.RESHAPE_TARGET, "")
        elif why:
            plan.status[t] = (TensorStatus.NOT_COMPARABLE, why)
        else:
            plan.pairs[t] = other
    sizes = _sizes(plan, ref_feeds, cand_feeds, ref_info, cand_info)
    plan.chunks, notes = chunk_tensors(list(plan.pairs), sizes, budget)
    plan.notes.extend(notes[:3])
    if len(notes) > 3:
        plan.notes.append(f"... and {len(notes) - 3} more tensors larger than the memory "
                          "budget, each run alone")
    return plan


def _reshape_targets(cand: onnx.ModelProto, consts: Mapping[str, onnx.TensorProto]) -> set[str]:
    """Constants of the candidate read only as a Reshape's shape: a rewrite (graphfix's
    fold-reshape-targets, onnxruntime's constant folding) may write a computed target
    [1, 200] as [0, 200] or [-1, 200], the same Reshape with other numbers, so the
    target is not compared; the Reshape's output is."""
    readers: dict[str, list[tuple[str, int]]] = {}
    for node in cand.graph.node:
        for i, name in enumerate(node.input):
            readers.setdefault(name, []).append((node.op_type, i))
    return {name for name in consts
            if readers.get(name) and all(r == ("Reshape", 1) for r in readers[name])}


def _dtype_name(elem: int) -> str:
    try:
        return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem))) if elem else ""
    except (KeyError, TypeError, ValueError):
        return helper.tensor_dtype_to_string(elem).removeprefix("TensorProto.").lower()


def _static_mismatch(ref_elem: int, cand_elem: int) -> str:
    """Why the declared types cannot compare ('' when they can, or are unknown)."""
    if not ref_elem or not cand_elem or ref_elem == cand_elem:
        return ""
    try:
        a = np.dtype(helper.tensor_dtype_to_np_dtype(ref_elem))
        b = np.dtype(helper.tensor_dtype_to_np_dtype(cand_elem))
    except (KeyError, TypeError, ValueError):
        return ""
    return "" if common_dtype(a, b) is not None else f"dtype {a} vs {b}"


def _sizes(plan: Plan, ref_feeds: dict, cand_feeds: dict, ref_info: dict,
           cand_info: dict) -> dict[str, int]:
    """Bytes per pair: the larger of what each model's run must hold (0 when neither
    side is a run output)."""
    group = plan.group
    ref_run = [t for t in plan.pairs if t not in plan.ref_inputs]
    cand_run = [c for c in plan.pairs.values() if _cand_runs(plan, c)]
    ref_bytes = (activation_bytes(group.reference.model, ref_run, ref_feeds, ref_info)
                 if ref_run else {})
    cand_bytes = (activation_bytes(group.candidate.model, cand_run, cand_feeds, cand_info)
                  if cand_run else {})
    return {t: max(ref_bytes.get(t, 0), cand_bytes.get(c, 0)) for t, c in plan.pairs.items()}


def _cand_runs(plan: Plan, name: str) -> bool:
    return name not in plan.cand_inputs and name not in plan.cand_consts


def run_plan(plan: Plan, samples: Sequence[Mapping[str, np.ndarray]], tallies: dict[str, Tally],
             *, renamed: Mapping[str, str], mode: str, threshold: float,
             tolerance: Tolerance | None = None, providers: Sequence[str],
             progress: Progress | None, step: tuple[int, int],
             engine: TrtEngine | None = None) -> None:
    """Run every chunk of `plan` on the group's samples and tally each pair.
    `step` is (runs done before this plan, runs in all) for progress; with `engine`
    the candidate runs there (module docstring)."""
    group = plan.group
    for k, chunk in enumerate(plan.chunks):
        ref_out = [t for t in chunk if t not in plan.ref_inputs]
        cand_out = [plan.pairs[t] for t in chunk if _cand_runs(plan, plan.pairs[t])]
        consts = [plan.pairs[t] for t in chunk if plan.pairs[t] in plan.cand_consts]
        ref_session = _session(group.reference.model, ref_out, providers, "reference")
        try:
            cand_session = (_EngineOutputs(engine, cand_out) if engine is not None and cand_out
                            else _session(group.candidate.model, cand_out, providers,
                                          "candidate"))
        except GraphfixError:
            close_runner(ref_session)
            raise
        phase = f"run {step[0] + k + 1}/{step[1]}: {len(chunk)} tensor{'s' * (len(chunk) != 1)}"
        if progress:
            progress(phase, 0, len(group.samples))
        try:
            for done, s in enumerate(group.samples, 1):
                ref = _values(group.reference.model, ref_session, ref_out, samples[s], {},
                              "reference")
                cand = _values(group.candidate.model, cand_session, cand_out, samples[s],
                               renamed, "candidate")
                cand.update({c: weights.to_array(plan.cand_consts[c]) for c in consts})
                for t in chunk:
                    tally = tallies.setdefault(t, Tally(plan.pairs[t]))
                    if plan.pairs[t] in cand:
                        tally.add(s, ref[t], cand[plan.pairs[t]], mode, threshold, tolerance)
                    else:  # a debug tensor the engine did not return: polygraphy's
                        # listener skips fp8/int4/fp4/bf16 ones
                        tally.why = tally.why or "the engine returned no value"
                del ref, cand
                if progress:
                    progress(phase, done, len(group.samples))
        finally:
            close_runner(ref_session)
            close_runner(cand_session)


def close_runner(runner) -> None:
    """Let a runner of ours go (None and engine views: nothing to do)."""
    if runner is not None and getattr(runner, "is_active", False):
        runner.deactivate()


class _EngineOutputs:
    """The engine as one chunk's runner: its run, kept to the chunk's tensors."""

    def __init__(self, engine: TrtEngine, names: list[str]) -> None:
        self.engine, self.names = engine, set(names)

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict:
        return {k: v for k, v in self.engine.infer(feeds).items() if k in self.names}


class _OrtRunner:
    """An onnxruntime session with `names` exposed, behind the runner interface the
    engine shares (`infer(feeds) -> {name: array}`). Not polygraphy's OnnxrtRunner:
    measured here, its infer took 136 us against session.run's 11 us (a 4-element
    Relu), and importing it 43 ms; together they took bench/check_bench.py from 1.40x
    to 1.52-1.65x polygraphy's own run, over issue 6's 1.5x."""

    def __init__(self, session, names: list[str]) -> None:
        self.session, self.names, self.is_active = session, names, True

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self.session.run(self.names, dict(feeds)), strict=True))

    def deactivate(self) -> None:
        self.session, self.is_active = None, False


def _session(model: onnx.ModelProto, names: list[str], providers: Sequence[str], which: str):
    """A runner whose outputs are `names` (None for none)."""
    if not names:
        return None
    try:
        return _OrtRunner(exposed_session(model, names, providers), names)
    except Exception as err:  # onnxruntime raises many types; all mean "cannot run it"
        raise run_error(which, err) from None


def _values(model, runner, names, feeds, renamed, which) -> dict[str, object]:
    """The feeds `model` takes plus its exposed tensors for one sample."""
    given = model_feeds(model, feeds, renamed)
    out: dict[str, object] = dict(given)
    if runner is not None:
        try:
            result = runner.infer(given)
        except GraphfixError:
            raise
        except Exception as err:
            blame = model if isinstance(runner, _OrtRunner) else None
            raise run_error(which, err, blame, given) from None
        out.update((n, result[n]) for n in names if n in result)
    return out
