"""Reference forms: what the numerical check runs in place of nodes onnxruntime cannot run.

A TensorRT plugin node (InstanceNormalization_TRT, ...) or a custom-domain op makes a model
unrunnable in onnxruntime. For the check only, `substitute()` gives each such node its
registered reference, looked up by (domain, op_type, version):

- `Decompose`: standard ONNX nodes (and initializers) computing the same outputs under the
  same output names; the substituted model runs in onnxruntime as it is.
- `Kernel`: a numpy function. The node stays in the model; `run()` executes it in stages
  (onnxruntime up to the node's inputs, the kernel in numpy, onnxruntime on from its
  outputs). Main graph only: a kernel node inside an If/Loop/Scan body is not checkable.

A node without a reference is listed in `Substitution.not_checkable`, never passed silently.
The built-in references are the one list `_BUILTIN` plus the `REFERENCES` of the provider
modules named in `_PROVIDERS` (imported on first lookup); `register()` adds more. Nothing here
was verified against a real TensorRT plugin: references follow the plugins' sources and docs.
"""

from __future__ import annotations

import importlib
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphfix import weights
from graphfix.errors import GraphfixError, InternalError
from graphfix.graph.ort_ops import ORT_ONNX_DOMAIN
from graphfix.graph.protos import all_nodes, subgraphs
from graphfix.runtime.session import run_model
from graphfix.trt.plugins import plugin_for

PLUGIN_DOMAIN = "trt.plugins"  # a registration here covers the plugin's op_type in any domain
FALLBACK_OPSET = 17  # default-domain opset added when a decomposed model imports none


def _norm(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


class Unavailable(Exception):
    """Raised by a decomposition that cannot handle this node; the message says why."""


class NeedsOpset(Unavailable):
    """Raised by a decomposition that handles this node but needs a newer default-domain
    opset than the model imports (DeformConv before 19). Raise it after every other check:
    a `Decompose.fallback` kernel then computes the node instead."""


@dataclass(frozen=True)
class Decomposition:
    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto] = field(default_factory=list)


@dataclass(frozen=True)
class Kernel:
    """compute(inputs, attributes) -> one array per node output. Inputs are numpy arrays
    (None for an omitted optional input); attributes are decoded (str, list, ndarray)."""

    compute: Callable[[list[Any], dict[str, Any]], Sequence[np.ndarray]]


@dataclass(frozen=True)
class Decompose:
    """build(node, default_opset) -> standard nodes writing the node's own output names.
    `fallback` computes the same in numpy where build raises NeedsOpset (main graph only)."""

    build: Callable[[onnx.NodeProto, int], Decomposition]
    fallback: Kernel | None = None


Reference = Decompose | Kernel


@dataclass(frozen=True)
class Registration:
    domain: str
    op_type: str
    reference: Reference
    versions: tuple[str, ...] | None = None  # None: any version


@dataclass(frozen=True)
class KernelNode:
    node: onnx.NodeProto
    kernel: Kernel


@dataclass
class Substitution:
    """The model to check in place of the input (never modified; the input itself when
    nothing was decomposed). Numpy kernels run by stages in `run()`, not as an onnxruntime
    custom-op library (docs/references.md says why)."""

    model: onnx.ModelProto
    replaced: list[str] = field(default_factory=list)
    not_checkable: list[str] = field(default_factory=list)
    kernels: list[KernelNode] = field(default_factory=list)  # main-graph order


class References:
    """A registry of reference forms; one (domain, op_type) may hold disjoint versions."""

    def __init__(self, entries: Iterable[Registration] = ()) -> None:
        self._entries: list[Registration] = []
        for entry in entries:
            self.add(entry)

    def add(self, entry: Registration) -> None:
        entry = Registration(_norm(entry.domain), entry.op_type, entry.reference, entry.versions)
        for old in self._entries:
            same = (old.domain, old.op_type) == (entry.domain, entry.op_type)
            if same and (old.versions is None or entry.versions is None
                         or set(old.versions) & set(entry.versions)):
                raise InternalError(f"a reference for {entry.op_type} ({entry.domain or 'ai.onnx'})"
                                    f" versions {entry.versions or 'any'} is already registered")
        self._entries.append(entry)

    def entries(self) -> list[Registration]:
        return list(self._entries)

    def find(self, domain: str, op_type: str, version: str) -> Registration | None:
        for entry in self._entries:
            if (entry.domain, entry.op_type) == (_norm(domain), op_type) and (
                    entry.versions is None or version in entry.versions):
                return entry
        return None

    def versions_of(self, domain: str, op_type: str) -> list[str]:
        return [v for e in self._entries if (e.domain, e.op_type) == (_norm(domain), op_type)
                for v in e.versions or ()]


def needs_reference(model: onnx.ModelProto) -> bool:
    """Whether any node (subgraphs included) is one onnxruntime cannot run natively."""
    functions = {(f.domain, f.name) for f in model.functions}
    kinds = {(node.domain, node.op_type) for node in all_nodes(model.graph)}
    return any(_foreign_kind(domain, op, functions) for domain, op in kinds)


def substitute(model: onnx.ModelProto, references: References | None = None) -> Substitution:
    """The model with every foreign node decomposed (main graph and subgraphs), kernel nodes
    recorded for `run()`, and the nodes without a reference listed as not checkable."""
    if not needs_reference(model):
        return Substitution(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    opsets = {_norm(o.domain): o.version for o in out.opset_import}
    walk = _Walk(references or _default(), opsets, {(f.domain, f.name) for f in out.functions},
                 _names(out.graph), Substitution(out))
    _walk_graph(out.graph, walk, nested=False)
    if not walk.decomposed:
        walk.result.model = model
    elif "" not in opsets:
        out.opset_import.append(helper.make_opsetid("", FALLBACK_OPSET))
    return walk.result


def schema_free(sub: Substitution) -> onnx.ModelProto:
    """For onnx.checker and shape inference only: `sub.model` (changed in place) with each
    node a numpy kernel computes moved out of the default domain to `PLUGIN_DOMAIN`, which
    the checker accepts and shape inference skips. A node with no reference stays where it
    is, for the checker to reject. Run it on a substitution of a copy."""
    computed = {o for k in sub.kernels for o in k.node.output if o}
    model = sub.model
    moved = False
    for node in model.graph.node:  # kernels run in the main graph only
        if _norm(node.domain) == "" and computed & set(node.output):
            node.domain = PLUGIN_DOMAIN
            moved = True
    if moved and PLUGIN_DOMAIN not in {o.domain for o in model.opset_import}:
        model.opset_import.append(helper.make_opsetid(PLUGIN_DOMAIN, 1))
    return model


def register(domain: str, op_type: str, reference: Reference,
             versions: tuple[str, ...] | None = None) -> None:
    """Add a reference to the default registry; InternalError when one overlaps."""
    _default().add(Registration(domain, op_type, reference, versions))


def registered() -> list[Registration]:
    return _default().entries()


def run(sub: Substitution, feeds: Mapping[str, np.ndarray],
        providers: Sequence[str] = ("cpu",)) -> dict[str, np.ndarray]:
    """Every graph output of the substituted model, by name. Without kernel nodes this is one
    onnxruntime run; with them, one run per kernel node plus one for the rest."""
    if sub.not_checkable:
        raise GraphfixError(f"The model cannot be run for checking: not checkable: "
                            f"{', '.join(sub.not_checkable)}",
                            "onnxruntime cannot run these nodes and graphfix has no reference "
                            "form for them", "see docs/references.md to register one")
    if not sub.kernels:
        return run_model(sub.model, feeds, providers)
    known = {k: np.asarray(v) for k, v in feeds.items()}
    for item in sub.kernels:
        known.update(_stage(sub.model, known, item.node.input, providers))
        args = [known[name] if name else None for name in item.node.input]
        outs = list(item.kernel.compute(args, attributes(item.node)))
        if len(outs) != len(item.node.output):
            raise InternalError(f"the kernel of {item.node.op_type} returned {len(outs)} arrays "
                                f"for {len(item.node.output)} outputs")
        known.update({n: np.asarray(a) for n, a in zip(item.node.output, outs, strict=True) if n})
    names = [o.name for o in sub.model.graph.output]
    known.update(_stage(sub.model, known, names, providers))
    return {name: known[name] for name in names}


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """The node's attributes as Python values: str for STRING, ndarray for TENSOR."""
    out: dict[str, Any] = {}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        elif isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8", "replace") for v in value]
        out[attr.name] = value
    return out


# ----------------------------------------------------------------------------- built-ins


def _erfc(node: onnx.NodeProto, opset: int) -> Decomposition:
    """TensorFlow's Erfc (tf2onnx leaves it in the ONNX domain) = 1 - Erf(x); the 1 takes
    x's type by CastLike (opset 15), else the numpy kernel computes it."""
    if opset < 15:
        raise NeedsOpset(f"its form needs CastLike (opset 15), the model imports {opset}")
    x, y = node.input[0], node.output[0]
    nodes = [helper.make_node("Erf", [x], [f"{y}__erf"]),
             helper.make_node("CastLike", [f"{y}__one", x], [f"{y}__one_typed"]),
             helper.make_node("Sub", [f"{y}__one_typed", f"{y}__erf"], [y])]
    return Decomposition(nodes, [numpy_helper.from_array(np.array(1.0, np.float32),
                                                         f"{y}__one")])


def _erfc_kernel(inputs: list[Any], attributes: dict[str, Any]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    return [np.vectorize(math.erfc, otypes=[np.float64])(x).astype(x.dtype)]


_BUILTIN: tuple[Registration, ...] = (  # TensorRT plugins' forms: graphfix.plugins.native
    Registration("", "Erfc", Decompose(_erfc, Kernel(_erfc_kernel))),
)
# Packages above runtime/ that hold reference forms, each exposing `REFERENCES: tuple[
# Registration, ...]`; imported by name on the first lookup (runtime/ imports none of them).
_PROVIDERS: tuple[str, ...] = ("graphfix.nms.efficient", "graphfix.nms.ssd",
                               "graphfix.plugins.native", "graphfix.plugins.deform",
                               "graphfix.plugins.trt_qdq")
_DEFAULT = References(_BUILTIN)
_providers_loaded = False
_LOADING = threading.RLock()


def _default() -> References:
    """The default registry: `_BUILTIN`, then every provider's `REFERENCES`, merged once.
    Under a lock, and marked loaded only once all are in: `graphfix run` looks references
    up from the original's thread and from the passes' at once, and a lookup that found
    the flag set while the other thread was still importing saw no provider's forms (a
    ModelOpt FP8 export came out "not checkable" with fold-constants as its only pass)."""
    global _providers_loaded
    with _LOADING:
        if not _providers_loaded:
            for module in _PROVIDERS:
                for entry in importlib.import_module(module).REFERENCES:
                    _DEFAULT.add(entry)
            _providers_loaded = True
    return _DEFAULT


# ----------------------------------------------------------------------------- the walk


@dataclass
class _Walk:
    refs: References
    opsets: dict[str, int]
    functions: set[tuple[str, str]]
    taken: set[str]
    result: Substitution
    decomposed: int = 0  # nodes decomposed so far

    def not_checkable(self, label: str) -> None:
        if label not in self.result.not_checkable:
            self.result.not_checkable.append(label)


def _walk_graph(graph: onnx.GraphProto, walk: _Walk, nested: bool) -> None:
    nodes: list[onnx.NodeProto] = []
    start = walk.decomposed
    for node in graph.node:
        for body in subgraphs(node):
            _walk_graph(body, walk, nested=True)
        nodes.extend(_replace(node, graph, walk, nested))
    if walk.decomposed != start:  # copies: nodes removed from a repeated field are detached
        fresh = [_copy(n) for n in nodes]
        del graph.node[:]
        graph.node.extend(fresh)


def _replace(node: onnx.NodeProto, graph: onnx.GraphProto, walk: _Walk,
             nested: bool) -> list[onnx.NodeProto]:
    if not _foreign(node, walk.functions):
        return [node]
    domain = _norm(node.domain)
    label = f"{node.op_type} ({domain or 'ai.onnx'})"
    version = _version(node, walk.opsets)
    entry = walk.refs.find(domain, node.op_type, version)
    if entry is None and plugin_for(node.op_type) is not None:
        domain = PLUGIN_DOMAIN
        entry = walk.refs.find(domain, node.op_type, version)
    if entry is None:
        others = walk.refs.versions_of(domain, node.op_type)
        walk.not_checkable(f"{label} version {version}: references exist for versions "
                           f"{', '.join(others)}" if others else label)
        return [node]
    where = f"{node.op_type} '{node.name or node.output[0]}'"
    if isinstance(entry.reference, Kernel):
        return _kernel(node, entry.reference, walk, nested, label, where)
    try:
        dec = entry.reference.build(node, walk.opsets.get("", FALLBACK_OPSET))
        _fit(dec, node, walk.taken)
    except NeedsOpset as exc:
        if entry.reference.fallback is None or nested:
            walk.not_checkable(f"{label}: {exc}")
            return [node]
        return _kernel(node, entry.reference.fallback, walk, nested, label, where)
    except Unavailable as exc:
        walk.not_checkable(f"{label}: {exc}")
        return [node]
    graph.initializer.extend(dec.initializers)
    walk.result.replaced.append(f"{where} -> {', '.join(n.op_type for n in dec.nodes)}")
    walk.decomposed += 1
    return list(dec.nodes)


def _kernel(node: onnx.NodeProto, kernel: Kernel, walk: _Walk, nested: bool, label: str,
            where: str) -> list[onnx.NodeProto]:
    if nested:
        walk.not_checkable(f"{label}: numpy kernels run only in the main graph")
    else:
        walk.result.kernels.append(KernelNode(_copy(node), kernel))
        walk.result.replaced.append(f"{where} -> numpy kernel")
    return [node]


def _fit(dec: Decomposition, node: onnx.NodeProto, taken: set[str]) -> None:
    """Check the decomposition writes the node's outputs; rename its own tensors that
    collide with names elsewhere in the model."""
    made = {o for n in dec.nodes for o in n.output if o}
    if missing := [o for o in node.output if o and o not in made]:
        raise InternalError(f"the reference of {node.op_type} does not write {missing}")
    own = (made | {t.name for t in dec.initializers}) - set(node.output)
    if clash := sorted(own & set(node.input)):
        raise Unavailable(f"its reference names tensors {clash} like the node's inputs")
    renames: dict[str, str] = {}
    for name in sorted(own):
        new, k = name, 0
        while new in taken:
            k += 1
            new = f"{name}_{k}"
        renames[name] = new
        taken.add(new)
    for n in dec.nodes:
        n.input[:] = [renames.get(i, i) for i in n.input]
        n.output[:] = [renames.get(o, o) for o in n.output]
    for t in dec.initializers:
        t.name = renames.get(t.name, t.name)


def _foreign(node: onnx.NodeProto, functions: set[tuple[str, str]]) -> bool:
    """onnxruntime cannot run it: a TensorRT plugin, or an op of no domain it implements.
    Model-local functions run (onnxruntime inlines them)."""
    return _foreign_kind(node.domain, node.op_type, functions)


def _foreign_kind(domain: str, op: str, functions: set[tuple[str, str]]) -> bool:
    """`_foreign` of a node of that domain and op type."""
    if (domain, op) in functions:
        return False
    domain = _norm(domain)
    if domain in ("", "ai.onnx.ml"):  # Split, ScatterND: standard, not plugins; and the
        # ops onnxruntime itself registers in the ONNX domain (its transformer fusions)
        return not onnx.defs.has(op, domain) and op not in ORT_ONNX_DOMAIN
    if domain == "com.microsoft":
        return plugin_for(op) is not None
    return True


def _version(node: onnx.NodeProto, opsets: Mapping[str, int]) -> str:
    """plugin_version (default "1") for a TensorRT plugin, else the domain's opset version."""
    if plugin_for(node.op_type) is not None:
        return str(attributes(node).get("plugin_version", "1"))
    return str(opsets.get(_norm(node.domain), ""))


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    return out


def _names(graph: onnx.GraphProto) -> set[str]:
    names = {v.name for v in (*graph.input, *graph.output, *graph.initializer)}
    for node in all_nodes(graph):
        names.update(node.input, node.output)
    return names


# ----------------------------------------------------------------------------- staged runs


def _stage(model: onnx.ModelProto, known: Mapping[str, np.ndarray], targets: Iterable[str],
           providers: Sequence[str]) -> dict[str, np.ndarray]:
    """The `targets` not yet in `known`, computed by onnxruntime on the main-graph nodes
    between `known` and them (a kernel node's outputs are in `known` by then)."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    wanted = [t for t in dict.fromkeys(targets) if t and t not in known]
    got = {t: weights.to_array(inits[t]) for t in wanted if t in inits}
    wanted = [t for t in wanted if t not in got]
    if not wanted:
        return got
    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    keep: set[int] = set()
    fed, used, stack, seen = set(), set(), list(wanted), set()
    while stack:
        name = stack.pop()
        if not name or name in seen:  # "": an omitted optional input
            continue
        seen.add(name)
        if name in known:
            fed.add(name)
        elif name in inits:
            used.add(name)
        elif name in producer:
            keep.add(producer[name])
            node = nodes[producer[name]]
            outer = (i for b in subgraphs(node) for n in all_nodes(b) for i in n.input)
            stack.extend([*node.input, *(i for i in outer if i in producer or i in inits
                                          or i in known)])
        else:
            raise GraphfixError(f"No value for '{name}' to run the model", "the feeds lack it",
                                "feed every graph input")
    inputs = [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(known[n].dtype), known[n].shape) for n in sorted(fed)]
    part = helper.make_graph([nodes[i] for i in sorted(keep)], graph.name, inputs,
                             [onnx.ValueInfoProto(name=t) for t in wanted],
                             [inits[n] for n in sorted(used)])
    staged = helper.make_model(part, opset_imports=model.opset_import,
                               ir_version=model.ir_version, functions=model.functions)
    got.update(run_model(staged, {n: known[n] for n in fed}, providers))
    return got
