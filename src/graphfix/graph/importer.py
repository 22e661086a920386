"""onnx-graphsurgeon's import of a model, building its objects directly.

`gs.import_onnx` builds each tensor and node through their constructors: every field
set goes through `Tensor.__setattr__` / `Node.__setattr__` (which watch for `inputs`
and `outputs`), and each node's input and output lists are `SynchronizedList`s that
extend the tensors' lists one `getattr` at a time. On swin_t (6,285 nodes) that import
was 0.13 s of a 1 s `graphfix run --no-check`, most of it in those constructors, and
it is paid again on every rollback.

`import_model` returns the same objects, built without the constructors: the same
classes, the same fields in the same order, the same tensors shared by the same nodes,
the same lazy values over the model's own TensorProtos (tests/graph/test_importer.py
compares the two imports object by object on the shared and generated models). What is
rare is still gs's own code: a model with local functions is imported by gs whole, and
a node whose attributes hold a graph (If/Loop/Scan bodies), a reference to a function
attribute or a type gs does not convert has its attributes imported by gs (bodies
included); a tensor whose type is not a plain tensor type, or whose element type numpy
lacks, is gs's `import_tensor`. What gs 0.6.1 loses is kept: a main-graph node's
TYPE_PROTO attributes (Optional's `type`) on request (`keep_types`), and the type of a
main-graph input, output or value_info gs cannot write back (a sequence of maps:
`kept_type`).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.importers.onnx_importer import OnnxImporter, get_numpy_type
from onnx_graphsurgeon.ir.tensor import LazyValues
from onnx_graphsurgeon.util.misc import SynchronizedList, volume

_A = onnx.AttributeProto
_new = object.__new__
_Variable, _Constant, _Node = gs.Variable, gs.Constant, gs.Node
_PLAIN_ATTRIBUTES = frozenset({_A.FLOAT, _A.INT, _A.STRING, _A.TENSOR, _A.FLOATS, _A.INTS,
                               _A.STRINGS})
"""Attribute types converted here, as gs's `import_attributes` converts them; a node
with any other (a graph, a sparse tensor, a type) goes to gs."""

_dtypes: dict[int, object] = {}


class EmptyList(list):
    """An empty INTS/FLOATS/STRINGS attribute, with its type: a list has none to infer
    from when there is no element (`graph.export` writes it back with this type; gs's
    exporter raises on any empty list). tf2onnx keeps TensorFlow attributes such as an
    empty `_collective_manager_ids`."""

    def __init__(self, attr_type: int) -> None:
        super().__init__()
        self.attr_type = attr_type

    def __reduce__(self):  # copies and pickles keep the type
        return (EmptyList, (self.attr_type,))


def _text(raw: bytes) -> str | bytes:
    """A STRING attribute as text, or as its bytes where they are not UTF-8 (ONNX allows
    any bytes: tf2onnx copies a TensorFlow op's serialized `config_proto`); either is
    written back as it was read."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw


def _numpy_type(elem: int):
    """gs's `get_numpy_type` of an ONNX element type (it lists onnx's types on each
    call), learnt once per type; None where numpy has none."""
    try:
        return _dtypes[elem]
    except KeyError:
        found = _dtypes[elem] = get_numpy_type(elem)
        return found


def import_model(model: onnx.ModelProto, keep_types: bool = False
                 ) -> tuple[gs.Graph, bool]:
    """What `gs.import_onnx(model)` returns (module docstring), and whether gs imported
    any part of it whole (a body or a function: `keep_types` then did not reach it).

    `keep_types`: a main-graph node keeps its TYPE_PROTO attributes (Optional's `type`),
    which gs 0.6.1 drops, each as its TypeProto after the attributes gs converts (gs
    exports a TypeProto value as one)."""
    if len(model.functions):
        return gs.import_onnx(model), True
    importer = _Importer(OnnxImporter.get_opset(model), OnnxImporter.get_import_domains(model),
                         keep_types)
    graph = importer.graph(model.graph, model.producer_name, model.producer_version,
                           model.ir_version)
    return graph, importer.bodies


def _synchronized(parent, field_name: str, items: list) -> SynchronizedList:
    """`SynchronizedList(parent, field_name, items)`: `items` also get `parent` appended
    to their `field_name` list."""
    made = list.__new__(SynchronizedList)
    made.parent_obj = parent
    made.field_name = field_name
    list.extend(made, items)
    for item in items:
        list.append(getattr(item, field_name), parent)
    return made


def _variable(name: str, dtype=None, shape=None, kind: str = "tensor_type") -> gs.Variable:
    """`gs.Variable(name, dtype, shape, kind)`."""
    tensor = _new(_Variable)
    fields = tensor.__dict__
    fields["name"] = name
    fields["inputs"] = _synchronized(tensor, "outputs", [])
    fields["outputs"] = _synchronized(tensor, "inputs", [])
    fields["dtype"] = dtype
    fields["shape"] = shape
    fields["type"] = kind
    return tensor


def _lazy(proto: onnx.TensorProto) -> LazyValues | None:
    """`LazyValues(proto)`; None where numpy has no type for its elements (gs then)."""
    dtype = _numpy_type(proto.data_type)
    if dtype is None:
        return None
    values = _new(LazyValues)
    values.tensor = proto
    values.shape = shape = proto.dims
    values.dtype = dtype
    values.nbytes = volume(shape) * np.dtype(dtype).itemsize  # gs's get_itemsize
    return values


def _constant(proto: onnx.TensorProto) -> gs.Constant:
    """gs's `import_tensor` of a TensorProto."""
    values = _lazy(proto)
    if values is None:
        return OnnxImporter.import_tensor(proto)
    tensor = _new(_Constant)
    fields = tensor.__dict__
    fields["name"] = proto.name
    fields["inputs"] = _synchronized(tensor, "outputs", [])
    fields["outputs"] = _synchronized(tensor, "inputs", [])
    fields["_values"] = values
    fields["data_location"] = (int(proto.data_location) if proto.HasField("data_location")
                               else None)
    fields["_export_dtype"] = None
    return tensor


def _value_info(info: onnx.ValueInfoProto) -> gs.Variable:
    """gs's `import_tensor` of a ValueInfoProto."""
    kind = info.type
    if not kind.ByteSize():
        return _variable(info.name)
    if kind.WhichOneof("value") != "tensor_type":
        tensor = OnnxImporter.import_tensor(info)
        if not _gs_exports(kind):
            tensor.__dict__["kept_type"] = onnx.TypeProto.FromString(kind.SerializeToString())
        return tensor
    tensor_type = kind.tensor_type
    dtype = _numpy_type(tensor_type.elem_type)
    if dtype is None:
        return OnnxImporter.import_tensor(info)
    shape = None
    if tensor_type.HasField("shape"):
        shape = []
        for dim in tensor_type.shape.dim:
            which = dim.WhichOneof("value")
            shape.append(dim.dim_param if which == "dim_param" else
                         dim.dim_value if which == "dim_value" else None)
    return _variable(info.name, dtype, shape)


def _gs_exports(kind: onnx.TypeProto) -> bool:
    """Whether gs 0.6.1 writes this non-tensor type back as it was: a sequence of tensors
    of a numpy element type, a sparse tensor, an optional (`graph.convert.export` types
    those). Not a map, or a sequence of maps (scikit-learn's ZipMap output): such a
    tensor keeps its TypeProto as `kept_type`, which the export writes back."""
    which = kind.WhichOneof("value")
    if which == "sequence_type":
        elem = kind.sequence_type.elem_type
        return (elem.WhichOneof("value") == "tensor_type"
                and _numpy_type(elem.tensor_type.elem_type) is not None)
    return which in ("sparse_tensor_type", "optional_type")


class _Importer:
    """gs's `OnnxImporter.import_graph` of a main graph (no outer tensors)."""

    def __init__(self, opset, import_domains, keep_types: bool) -> None:
        self.opset, self.import_domains, self.keep_types = opset, import_domains, keep_types
        self.bodies = False  # whether gs imported a body (a node's graph attribute)

    def graph(self, proto: onnx.GraphProto, producer_name: str, producer_version: str,
              ir_version: int) -> gs.Graph:
        tensors: OrderedDict[str, gs.Tensor] = OrderedDict()
        for initializer in proto.initializer:
            if initializer.name not in tensors:
                tensors[initializer.name] = _constant(initializer)
        for sparse in proto.sparse_initializer:
            if sparse.values.name not in tensors:
                tensors[sparse.values.name] = OnnxImporter.import_tensor(sparse)
        for info in proto.value_info:
            self._overwrite(tensors, info)
        constants = {t.name for t in proto.initializer}
        constants.update(t.values.name for t in proto.sparse_initializer)
        inputs = [self._tensor(tensors, i) for i in proto.input if i.name not in constants]
        # the outputs after the nodes (gs takes them before): a body's own constant named
        # like a graph output (optimum's merged decoders: the with-past branch returns
        # an empty `present.*.encoder.*` initializer, the If returns it under that name)
        # would otherwise resolve to the outer graph's output, and the body lose it
        before = set(tensors)
        nodes = [self._node(n, tensors) for n in proto.node]
        outputs = [self._output(tensors, o, before) for o in proto.output]
        return gs.Graph(nodes=nodes, inputs=inputs, outputs=outputs, name=proto.name,
                        doc_string=proto.doc_string, producer_name=producer_name,
                        producer_version=producer_version, opset=self.opset,
                        import_domains=self.import_domains, functions=[],
                        ir_version=ir_version)

    @staticmethod
    def _tensor(tensors: dict, info: onnx.ValueInfoProto) -> gs.Tensor:
        found = tensors.get(info.name)
        if found is None:
            found = tensors[info.name] = _value_info(info)
        return found

    @classmethod
    def _output(cls, tensors: dict, info: onnx.ValueInfoProto, before: set[str]) -> gs.Tensor:
        """A graph output as gs imports it: a tensor named before the nodes is that one; one
        a node made takes everything the output's ValueInfo says (gs makes it from that
        ValueInfo first and the node then writes it)."""
        found = tensors.get(info.name)
        if found is None or info.name in before or not isinstance(found, _Variable):
            return cls._tensor(tensors, info)
        declared = _value_info(info)
        found.__dict__.update({k: v for k, v in declared.__dict__.items()
                               if k not in ("name", "inputs", "outputs")})
        return found

    @staticmethod
    def _overwrite(tensors: dict, info: onnx.ValueInfoProto) -> None:
        """gs's `get_tensor(info, overwrite=True)`: a name seen before keeps its dtype and
        shape where it has them (as gs tests them: truthiness) and takes the info's."""
        found = tensors.get(info.name)
        if found is None:
            tensors[info.name] = _value_info(info)
            return
        if isinstance(found, _Variable):  # gs imports the info for a constant too, unused
            other = _value_info(info)
            found.dtype = found.dtype or other.dtype
            found.shape = found.shape or other.shape

    def _node(self, proto: onnx.NodeProto, tensors: dict) -> gs.Node:
        """gs's `import_node` (main graph: no outer tensors)."""
        attributes = self._attributes(proto, tensors)
        inputs = [self._named(tensors, name) for name in proto.input]
        outputs = [self._named(tensors, name) for name in proto.output]
        node = _new(_Node)
        fields = node.__dict__
        fields["op"] = proto.op_type
        fields["name"] = proto.name
        fields["attrs"] = attributes
        fields["inputs"] = _synchronized(node, "outputs", inputs)
        fields["outputs"] = _synchronized(node, "inputs", outputs)
        fields["domain"] = proto.domain if proto.HasField("domain") else None
        return node

    @staticmethod
    def _named(tensors: dict, name: str) -> gs.Tensor:
        """gs's `get_tensor` of a node's input or output: the graph's tensor of that name,
        else a new one, which the graph keeps unless the name is empty (an omitted
        optional input or output: never shared)."""
        found = tensors.get(name)
        if found is None:
            found = _variable(name)
            if name:
                tensors[name] = found
        return found

    def _attributes(self, proto: onnx.NodeProto, tensors: dict) -> OrderedDict:
        """gs's `import_attributes` of the node's attributes."""
        converted: OrderedDict = OrderedDict()
        for attr in proto.attribute:
            kind = attr.type
            if kind not in _PLAIN_ATTRIBUTES or attr.ref_attr_name:
                return self._by_gs(proto, tensors)
            if kind == _A.INT:
                converted[attr.name] = attr.i
            elif kind == _A.INTS:
                converted[attr.name] = list(attr.ints) or EmptyList(kind)
            elif kind == _A.FLOAT:
                converted[attr.name] = attr.f
            elif kind == _A.FLOATS:
                converted[attr.name] = list(attr.floats) or EmptyList(kind)
            elif kind == _A.STRING:
                converted[attr.name] = _text(attr.s)
            elif kind == _A.STRINGS:
                converted[attr.name] = [_text(s) for s in attr.strings] or EmptyList(kind)
            else:
                converted[attr.name] = _constant(attr.t)
        return converted

    def _by_gs(self, proto: onnx.NodeProto, tensors: dict) -> OrderedDict:
        """gs's `import_attributes` of the node's attributes (bodies included), and its
        TYPE_PROTO ones with `keep_types`."""
        converted = OnnxImporter.import_attributes(proto.attribute, OrderedDict(), tensors,
                                                   self.opset, self.import_domains)
        for attr in proto.attribute:
            if attr.type in (_A.GRAPH, _A.GRAPHS):
                self.bodies = True
            elif attr.type == _A.TYPE_PROTO and self.keep_types:
                converted[attr.name] = attr.tp
            elif attr.type in (_A.INTS, _A.FLOATS, _A.STRINGS) and not converted.get(attr.name):
                converted[attr.name] = EmptyList(attr.type)  # typed, as in `_attributes`
        return converted
