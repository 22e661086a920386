"""Small helpers over onnx-graphsurgeon used by passes and the manager."""

from graphfix.graph.convert import to_graph, to_model
from graphfix.graph.rewire import (
    bypass,
    constant_value,
    fresh_name,
    is_graph_output,
    replace_in,
    take_output,
)
from graphfix.graph.walk import (
    all_graphs,
    count_nodes,
    fingerprint,
    is_onnx,
    node_label,
    opset_of,
)

__all__ = [
    "all_graphs",
    "bypass",
    "constant_value",
    "count_nodes",
    "fingerprint",
    "fresh_name",
    "is_graph_output",
    "is_onnx",
    "node_label",
    "opset_of",
    "replace_in",
    "take_output",
    "to_graph",
    "to_model",
]
