"""The models `bench/scale_bench.py` measures (issue 18): the shared models, the zoo's
large models, and a synthetic model that scales with its block count.

No graphfix import here (the bench's parent process stays light); onnx and numpy only
for the synthetic builder, imported when it runs.

Shapes: `shapes` gives every input that has a dynamic dim its full shape, and every tool
gets the same ones (graphfix `--input-shape`, onnxsim `test_input_shapes` through
`bench/child.py`, polygraphy `--input-shapes`). Static inputs get none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import zoo_models

HERE = Path(__file__).resolve().parent
SHARED_DIR = Path(os.environ.get("GRAPHFIX_BENCH_MODELS", HERE.parent.parent / "shared" / "models"))

SHARED = {  # name -> (file in SHARED_DIR, shapes of the dynamic inputs)
    "digits_dev": ("digits_dev.onnx", {"input": (1, 3, 32, 32)}),
    "digits_silu_dev": ("digits_silu_dev.onnx", {"input": (1, 3, 32, 32)}),
    "digits_hswish_dev": ("digits_hswish_dev.onnx", {"input": (1, 3, 32, 32)}),
    "mobilenet_v3_small_bn": ("mobilenet_v3_small_bn.onnx", {"input": (1, 3, 224, 224)}),
    "ppocr_cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": (1, 3, 48, 192)}),
    "ssdlite320": ("ssdlite320_mobilenet_v3_large.onnx", {}),  # images [3,320,320] static
}
ZOO_LARGE = ("wide_resnet50_2", "vit_b_32", "swin_t", "maxvit_t", "maskrcnn_resnet50_fpn",
             "keypointrcnn_resnet50_fpn", "fcos_resnet50_fpn",
             # the models of the issue's own report (ViT-B/16, RetinaNet, Faster R-CNN)
             "vit_b_16", "retinanet_resnet50_fpn", "fasterrcnn_resnet50_fpn",
             # two of them as torch's default exporter writes them (external data)
             "maxvit_t_dynamo", "vit_b_16_dynamo")
"""The zoo models issue 18 names and reports on (`--models zoo`); any other zoo model can
be named alone."""
GROUPS = ("shared", "zoo", "synthetic")
DEFAULT_BLOCKS = (10, 100, 1000)

SYNTH_CHANNELS, SYNTH_SIDE = 32, 16
"""The synthetic model's width and feature-map side: about 76 KB of weights and 7 nodes per block
(1000 blocks: 7,003 nodes, 72 MiB, ~9.4 GFLOP per inference)."""


@dataclass(frozen=True)
class BenchModel:
    """One model of the bench. `path` is None for a synthetic model until it is built
    (`build`); `blocks` is its block count and `nodes` its node count (0 for real
    models: the bench reads theirs from graphfix's run)."""

    name: str
    group: str
    path: Path | None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    blocks: int = 0
    nodes: int = 0

    def shape_specs(self) -> list[str]:
        """NAME:1x3x224x224, as graphfix and bench/child.py take them."""
        return [f"{k}:{'x'.join(map(str, v))}" for k, v in self.shapes.items()]

    def polygraphy_shapes(self) -> list[str]:
        if not self.shapes:
            return []
        return ["--input-shapes", *(f"{k}:[{','.join(map(str, v))}]"
                                    for k, v in self.shapes.items())]


def synthetic_name(blocks: int) -> str:
    return f"synthetic_{blocks}"


def select(text: str, blocks: tuple[int, ...], cache: Path) -> list[BenchModel]:
    """`--models`: groups (shared, zoo, synthetic) and single names, comma-separated.
    An unknown name raises ValueError naming the known ones; a zoo model that is not
    cached raises with the command that makes it."""
    chosen: list[BenchModel] = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        if item == "shared":
            chosen += [_shared(n) for n in SHARED]
        elif item == "zoo":
            chosen += [_zoo(n, cache) for n in ZOO_LARGE]
        elif item == "synthetic":
            chosen += [BenchModel(synthetic_name(n), "synthetic", None, {}, n) for n in blocks]
        elif item in SHARED:
            chosen.append(_shared(item))
        elif item in zoo_models.BY_NAME:
            chosen.append(_zoo(item, cache))
        else:
            raise ValueError(f"unknown model {item!r}; give groups ({', '.join(GROUPS)}), "
                             f"shared models ({', '.join(SHARED)}) or zoo models "
                             f"(`python bench/zoo.py list`)")
    seen: set[str] = set()
    return [m for m in chosen if not (m.name in seen or seen.add(m.name))]


def _shared(name: str) -> BenchModel:
    file_name, shapes = SHARED[name]
    path = SHARED_DIR / file_name
    if not path.exists():
        raise ValueError(f"{path} does not exist (set GRAPHFIX_BENCH_MODELS to the shared "
                         "models' folder)")
    return BenchModel(name, "shared", path, dict(shapes))


def _zoo(name: str, cache: Path) -> BenchModel:
    spec = zoo_models.BY_NAME[name]
    path = cache / spec.file_name
    if not path.exists():
        raise ValueError(f"zoo model {name} is not in {cache}: run "
                         f"`python bench/zoo.py export {name}` (or pass --cache)")
    return BenchModel(name, "zoo", path, dict(spec.check_shapes))


def build(model: BenchModel, folder: Path) -> BenchModel:
    """The synthetic model written to `folder` (real models come back as they are)."""
    if model.group != "synthetic":
        return model
    import onnx

    path = folder / f"{model.name}.onnx"
    built = synthetic(model.blocks)
    onnx.save(built, path)
    return BenchModel(model.name, model.group, path, model.shapes, model.blocks,
                      len(built.graph.node))


def synthetic(blocks: int, channels: int = SYNTH_CHANNELS, side: int = SYNTH_SIDE,
              seed: int = 0):
    """`blocks` residual blocks, each Conv-BN-ReLU-Conv-BN-Add-ReLU (a ResNet basic block;
    Conv with bias, BN kept so fold-bn has 2 folds per block), between a stem Conv and a
    GlobalAveragePool + Flatten head. Static shapes, inline seeded weights, opset 17.

    input [1, C, S, S] -> output [1, C]; 7 * blocks + 3 nodes. The residual branch is
    scaled down (BN gain 0.05-0.15) so that 1000 blocks keep activations finite.
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def const(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def conv(x: str, name: str) -> str:
        w = const(f"{name}.w", rng.standard_normal((channels, channels, 3, 3))
                  / np.sqrt(channels * 9))
        b = const(f"{name}.b", rng.uniform(-0.1, 0.1, channels))
        nodes.append(helper.make_node("Conv", [x, w, b], [name], name=name,
                                      kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        return name

    def bn(x: str, name: str, gain: tuple[float, float]) -> str:
        stats = [const(f"{name}.{k}", v) for k, v in (
            ("scale", rng.uniform(*gain, channels)), ("bias", rng.uniform(-0.05, 0.05, channels)),
            ("mean", rng.uniform(-0.1, 0.1, channels)), ("var", rng.uniform(0.5, 1.5, channels)))]
        nodes.append(helper.make_node("BatchNormalization", [x, *stats], [name], name=name,
                                      epsilon=1e-5))
        return name

    def op(kind: str, inputs: list[str], name: str) -> str:
        nodes.append(helper.make_node(kind, inputs, [name], name=name))
        return name

    x = conv("input", "stem")
    for i in range(blocks):
        p = f"b{i}"
        y = op("Relu", [bn(conv(x, f"{p}.conv1"), f"{p}.bn1", (0.5, 1.5))], f"{p}.relu1")
        y = bn(conv(y, f"{p}.conv2"), f"{p}.bn2", (0.05, 0.15))
        x = op("Relu", [op("Add", [x, y], f"{p}.add")], f"{p}.relu2")
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["output"], name="flatten"))
    graph = helper.make_graph(
        nodes, f"synthetic_{blocks}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, channels, side, side])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, channels])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="graphfix bench/scale_models.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
