"""The dev zoo's catalogue: which models, where they come from, how they are checked.

No torch here: the catalogue is read by `bench/zoo.py list`, by the run step and by
`tests/zoo/test_zoo.py`, which must import without torch. Exporting is
`bench/zoo_export.py`.

Two sources:
- `torchvision`: built with random weights (seeded) and randomised BatchNorm statistics,
  exported with the legacy TorchScript exporter at opset 17 with the BN nodes kept
  (`zoo_export`). Every input and output has a dynamic batch axis, except the
  detection models: torchvision's detection models take a *list* of 3-D images, so
  they are exported for one image of dynamic height and width, and their outputs have a
  dynamic number of detections (axis 0). A few are exported a second time, as torch's
  default exporter writes them since torch 2.9 (`exporter="dynamo"`, named `*_dynamo`):
  its own opset (20 with torch 2.13), its own graph optimizations (BatchNorm folded in
  eval mode), the weights in a `.data` file beside the model.
- `text`: transformers models (BERT, GPT-2) built from a small config with random
  weights (seeded), exported by either torch exporter with a dynamic batch and sequence,
  as users export them (`zoo_export.export_transformers`).
- `yolo`: an ultralytics YOLO built from its yaml with random weights, exported by
  ultralytics' own exporter (`model.export(format="onnx")`, without its onnxslim step), as
  its users run it (`zoo_export.export_ultralytics`).
- `wheel`: ONNX files shipped inside PyPI wheels of other toolchains (PaddleOCR models
  in rapidocr-onnxruntime, Silero VAD in silero-vad), exported by their authors.

`check_shapes` are the input shapes every numerical check uses (graphfix's own, the
run step's comparison, the test): dynamic dims that graphfix cannot guess. A scalar
input (silero's `sr`) has no entry: graphfix gives it the constant the graph compares it
with (16000).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

CACHE_ENV = "GRAPHFIX_ZOO"
DEFAULT_CACHE = Path("~/.cache/graphfix/zoo")
SMALL_MB = 30
"""`--small` and the zoo test take the models whose ONNX file is under this size (MiB)."""


@dataclass(frozen=True)
class ZooModel:
    """One zoo model. `kind` selects how torchvision models are built and exported
    (`image`, `segmentation`, `video`, `flow`, `detection`); wheel models have kind
    `wheel`. `export_shapes`: the example inputs the exporter traces with (batch 2, so
    that the trace cannot bake in a batch of 1; the checks run batch 1). `size_mb`: the
    model's size in MiB as exported here (torch 2.13), its `.data` file included, for
    `--small`. `exporter`: torch's `torchscript` (`dynamo=False`) or `dynamo` (its
    default); `arch`: the torchvision model it is, where the name says more."""

    name: str
    kind: str
    check_shapes: dict[str, tuple[int, ...]]
    size_mb: float
    export_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    outputs: tuple[str, ...] = ("output",)
    options: dict[str, object] = field(default_factory=dict)
    wheel: str = ""  # pip requirement, for kind "wheel"
    member: str = ""  # the .onnx file's path inside the wheel
    note: str = ""
    exporter: str = "torchscript"
    arch: str = ""

    @property
    def file_name(self) -> str:
        return f"{self.name}.onnx"

    @property
    def torchvision_name(self) -> str:
        return self.arch or self.name

    @property
    def small(self) -> bool:
        return self.size_mb < SMALL_MB


def _image(name: str, size_mb: float, side: int = 224) -> ZooModel:
    return ZooModel(name, "image", {"input": (1, 3, side, side)}, size_mb,
                    {"input": (2, 3, side, side)})


def _dynamo(arch: str, size_mb: float) -> ZooModel:
    """An image classifier as torch's default exporter writes it (module docstring)."""
    return ZooModel(f"{arch}_dynamo", "image", {"input": (1, 3, 224, 224)}, size_mb,
                    {"input": (2, 3, 224, 224)}, exporter="dynamo", arch=arch,
                    note="torch's default exporter (dynamo=True); weights in a .data file")


def _text(name: str, family: str, size_mb: float, exporter: str = "torchscript") -> ZooModel:
    """A transformers model of `family` (`zoo_export.TEXT_CONFIGS`), checked at batch 1
    and 16 tokens; every input shares the batch and sequence dims."""
    names = ("input_ids", "attention_mask") + (("token_type_ids",) if family == "bert" else ())
    outputs = ("last_hidden_state", "pooler_output") if family == "bert" else ("logits",)
    return ZooModel(name, "text", {n: (1, 16) for n in names}, size_mb,
                    {n: (2, 16) for n in names}, outputs=outputs, exporter=exporter,
                    arch=family, note="transformers, 4 layers, random weights; dynamic "
                    "batch and sequence")


def _segmentation(name: str, size_mb: float) -> ZooModel:
    return ZooModel(name, "segmentation", {"input": (1, 3, 224, 224)}, size_mb,
                    {"input": (2, 3, 224, 224)}, outputs=("out",),
                    options={"weights_backbone": None})


_BOXES = ("boxes", "scores", "labels")
_RCNN = ("boxes", "labels", "scores")


def _detection(name: str, size_mb: float, outputs: tuple[str, ...], side: int = 320,
               **options: object) -> ZooModel:
    return ZooModel(name, "detection", {"image": (3, side, side)}, size_mb,
                    {"image": (3, side, side)}, outputs=outputs,
                    options={"weights_backbone": None, **options},
                    note="one 3-D image of dynamic height and width (no batch axis)")


def _wheel(name: str, wheel: str, member: str, shapes: dict[str, tuple[int, ...]],
           size_mb: float) -> ZooModel:
    return ZooModel(name, "wheel", shapes, size_mb, wheel=wheel, member=member,
                    note=f"from the {wheel} wheel")


_OCR = "rapidocr-onnxruntime==1.2.13"
_VAD = "silero-vad==5.1.2"
_RCNN_320 = {"min_size": 320, "max_size": 320}
"""R-CNN and FCOS resize every image to 800 px by default; 320 keeps a CPU check of a
detection model at seconds, not minutes. Score thresholds stay torchvision's: with random
weights and the seeded inputs the models still detect (Mask R-CNN: 4,046 of its 90,000
class boxes score over 0.05 before NMS), so the checks compare boxes, not empty tensors."""

MODELS: tuple[ZooModel, ...] = (
    _image("resnet18", 44.6),
    _image("resnet34", 83.2),
    _image("wide_resnet50_2", 263),
    _image("resnext50_32x4d", 95.8),
    _image("mobilenet_v2", 13.6),
    _image("mobilenet_v3_large", 21.1),
    _image("densenet121", 30.9),
    _image("shufflenet_v2_x1_0", 8.9),
    _image("squeezenet1_1", 4.7),
    _image("googlenet", 25.4),
    _image("mnasnet1_0", 16.9),
    _image("efficientnet_b0", 20.4),
    _image("efficientnet_b1", 30.1),
    _image("efficientnet_v2_s", 82.5),
    _image("regnet_x_400mf", 21.2),
    _image("regnet_y_400mf", 16.8),
    _image("convnext_tiny", 109),
    _image("swin_t", 110),
    _image("maxvit_t", 120),
    _image("vit_b_32", 337),
    _image("vit_b_16", 330),  # the issue-18 report's ViT-B/16
    # torch's default exporter since 2.9 (swin_t does not export with a dynamic batch:
    # torch 2.13 raises a constraint violation)
    _dynamo("mobilenet_v3_large", 21.2),
    _dynamo("efficientnet_b0", 20.6),
    _dynamo("convnext_tiny", 109),
    _dynamo("maxvit_t", 121),
    _dynamo("vit_b_16", 331),
    _segmentation("lraspp_mobilenet_v3_large", 12.4),
    _segmentation("deeplabv3_mobilenet_v3_large", 42.2),
    _segmentation("fcn_resnet50", 126),
    _detection("ssd300_vgg16", 136, _BOXES, side=300),
    _detection("ssdlite320_mobilenet_v3_large", 13.7, _BOXES),
    _detection("fcos_resnet50_fpn", 124, _BOXES, **_RCNN_320),
    _detection("keypointrcnn_resnet50_fpn", 226, (*_RCNN, "keypoints", "keypoints_scores"),
               **_RCNN_320),
    _detection("maskrcnn_resnet50_fpn", 170, (*_RCNN, "masks"), **_RCNN_320),
    # the issue-18 report's RetinaNet and Faster R-CNN
    _detection("retinanet_resnet50_fpn", 130, _BOXES, **_RCNN_320),
    _detection("fasterrcnn_resnet50_fpn", 160, _RCNN, **_RCNN_320),
    # transformers models and ultralytics YOLO, the other exports TensorRT users bring:
    # BERT's token_type_ids index a 2-row table; GPT-2 from torch's default exporter has
    # allowzero=1 on every Reshape; YOLOv8 with dynamic=True builds its anchor grids with
    # Range over feature-map widths
    _text("bert", "bert", 20.7),
    _text("gpt2_dynamo", "gpt2", 21.3, exporter="dynamo"),
    ZooModel("yolov8n_dynamic", "yolo", {"images": (1, 3, 320, 320)}, 12.1,
             outputs=("output0",), options={"cfg": "yolov8n.yaml", "imgsz": 320,
                                              "dynamic": True},
             note="ultralytics' exporter, dynamic=True: batch, height and width dynamic"),
    ZooModel("r3d_18", "video", {"input": (1, 3, 8, 112, 112)}, 127,
             {"input": (2, 3, 8, 112, 112)}, note="3-D convolutions (video)"),
    ZooModel("raft_small", "flow",
             {"image1": (1, 3, 128, 128), "image2": (1, 3, 128, 128)}, 4.1,
             {"image1": (2, 3, 128, 128), "image2": (2, 3, 128, 128)}, outputs=("flow",),
             note="optical flow; exported for its final flow (12 updates)"),
    _wheel("ppocrv3_det", _OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv3_det_infer.onnx",
           {"x": (1, 3, 320, 320)}, 2.3),
    _wheel("ppocrv3_rec", _OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv3_rec_infer.onnx",
           {"x": (1, 3, 48, 320)}, 10.2),
    _wheel("ppocr_mobile_v2_cls", _OCR,
           "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
           {"x": (1, 3, 48, 192)}, 0.6),
    _wheel("silero_vad", _VAD, "silero_vad/data/silero_vad.onnx",
           {"input": (1, 512), "state": (2, 1, 128)}, 2.2),
    _wheel("silero_vad_half", _VAD, "silero_vad/data/silero_vad_half.onnx",
           {"input": (1, 512), "state": (2, 1, 128)}, 1.2),
)
BY_NAME = {m.name: m for m in MODELS}


def cache_dir(given: str | os.PathLike | None = None) -> Path:
    """The zoo's cache folder: `given` (--cache), else $GRAPHFIX_ZOO, else
    ~/.cache/graphfix/zoo. Outside the repository: the files are hundreds of MB."""
    chosen = given or os.environ.get(CACHE_ENV) or DEFAULT_CACHE
    return Path(chosen).expanduser()


def model_mib(path: Path) -> float:
    """A model's size in MiB, the external data files it names included (torch's default
    exporter writes the weights into NAME.onnx.data beside the model). Read as graphfix
    reads a model, its weights left in their files (`io.load(weights=False)`): 0.6 s
    for the whole zoo, where `onnx.load` without external data took 9.4 s."""
    from graphfix import io, weights

    model = io.load(str(path), weights=False)
    files = {path.resolve(), *(Path(weights.data_file(t)).resolve()
                               for t in weights.deferred(model))}
    return sum(f.stat().st_size for f in files if f.exists()) / 2**20


def select(names: list[str] | None = None, small: bool = False) -> list[ZooModel]:
    """The models named (all when none are), only the small ones with `small`.
    An unknown name raises ValueError naming the known ones."""
    unknown = [n for n in names or [] if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown zoo model(s) {', '.join(unknown)}; "
                         f"known: {', '.join(BY_NAME)}")
    chosen = [BY_NAME[n] for n in names] if names else list(MODELS)
    return [m for m in chosen if m.small] if small else chosen
