"""NMS in detection models: finding NMS regions and raw detector heads, the logic of the
split-nms / add-nms / plugin-to-nms passes, standard-ONNX decompositions of TensorRT's NMS
plugins (their reference forms for the numerical check), and a detection comparator that
matches boxes by IoU instead of comparing NMS outputs element by element."""

from graphfix._lazy import lazy_attributes

_LAZY = {
    "NmsRegion": "graphfix.nms.regions",
    "find_regions": "graphfix.nms.regions",
    "SplitManifest": "graphfix.nms.chain",
    "SplitModel": "graphfix.nms.chain",
    "load_manifest": "graphfix.nms.chain",
    "run_split": "graphfix.nms.chain",
    "save_split": "graphfix.nms.chain",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
