"""TensorRT knowledge as versioned data, and the one lazy door to `tensorrt`.

- `parse_target("10.12")` -> `TrtTarget`: which documented operator table applies
  (nearest at or below), `target.op("NonZero")` -> `OpSupport`, opset range, types.
- `plugin_for("EfficientNMS_TRT")` -> `PluginSpec`, `spec.status_at(target)`.
- `graphfix.trt.parser`: read TensorRT ONNX-parser error messages and map them to
  nodes; run the real parser when tensorrt is installed.

The data are shipped copies of ../shared/trt/onnx_trt_operators.json and
trt_plugins.json (package data, `graphfix/trt/data`). `tensorrt` is imported only by
`installed_tensorrt_version`, `parse_target(None)` and `run_trt_parser`, when called.
"""

from graphfix.trt.matrix import (
    OpSupport,
    TrtTarget,
    documented_versions,
    import_tensorrt,
    installed_tensorrt_version,
    native_nms_from,
    parse_target,
    parser_behaviour_notes,
)
from graphfix.trt.parser import (
    ParserError,
    map_errors_to_nodes,
    parse_error_message,
    run_trt_parser,
)
from graphfix.trt.plugins import (
    PluginAttr,
    PluginSpec,
    is_nms_plugin,
    plugin_attribute_rules,
    plugin_for,
)

__all__ = [
    "OpSupport",
    "ParserError",
    "PluginAttr",
    "PluginSpec",
    "TrtTarget",
    "documented_versions",
    "import_tensorrt",
    "installed_tensorrt_version",
    "is_nms_plugin",
    "map_errors_to_nodes",
    "native_nms_from",
    "parse_error_message",
    "parse_target",
    "parser_behaviour_notes",
    "plugin_attribute_rules",
    "plugin_for",
    "run_trt_parser",
]
