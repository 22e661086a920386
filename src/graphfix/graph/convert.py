"""ModelProto <-> onnx_graphsurgeon.Graph, keeping model-level fields gs drops."""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.logger import G_LOGGER


def to_graph(model: onnx.ModelProto) -> gs.Graph:
    """Import a model into onnx-graphsurgeon (weights stay lazy, not copied)."""
    with G_LOGGER.suppress():
        return gs.import_onnx(model)


def to_model(graph: gs.Graph, like: onnx.ModelProto) -> onnx.ModelProto:
    """Export `graph`, carrying over `like`'s metadata, version fields and IR version."""
    with G_LOGGER.suppress():
        model = gs.export_onnx(graph, do_type_check=False)
    model.ir_version = like.ir_version
    model.producer_name = like.producer_name
    model.producer_version = like.producer_version
    model.domain = like.domain
    model.model_version = like.model_version
    model.doc_string = like.doc_string
    del model.metadata_props[:]
    model.metadata_props.extend(like.metadata_props)
    return model
