r"""Re-make the deformable-convolution exports in this folder (not run by the tests).

The tests need the graphs real exporters write, and neither mmcv's compiled ops nor a
loadable torchvision extension exist on the CPU-only dev machines, so this script exports
with the exporters' own Python code and stands in only for the kernels:

- mmcv 2.2.0 (its sdist unpacked, path in MMCV_SRC; mmengine installed): the graph comes
  from mmcv's own `symbolic` methods (`mmcv::MMCVModulatedDeformConv2d`,
  `mmcv::MMCVDeformConv2d`). `mmcv._ext` is replaced by no-op functions: tracing calls
  forward, whose output values do not reach the graph.
- torchvision 0.28: `torchvision::deform_conv2d` is defined with the C++ extension's schema
  (torchvision/csrc/ops/deform_conv2d.cpp) and a shape-only kernel, then exported by
  torchvision's own `ops.DeformConv2d` through torch's TorchScript exporter with
  ONNX_FALLTHROUGH (the custom-domain form, opset 17) and through the dynamo exporter
  (onnxscript's torchlib writes ONNX DeformConv, opset 20).

Where torchvision's wheel is the CUDA build (its extension cannot load, so `import
torchvision` fails on torchvision::nms), TV_SHIM names a module defining nms/roi_align
in Python first (the dev zoo's tvshim.py); deform_conv2d is defined here either way.

Weights are seeded and the offset convolutions random (mmcv zero-initialises them, which
would make every offset 0). Run with a Python that has torch, torchvision and onnxscript:
    MMCV_SRC=/tmp/mmcv-2.2.0 [TV_SHIM=path/to/tvshim.py] \
        python tests/plugins/data/export_deform.py
"""

import os
import pathlib
import sys
import types

import onnx
import torch

HERE = pathlib.Path(__file__).parent


def _mmcv_modules():
    sys.path.insert(0, os.environ["MMCV_SRC"])
    ext = types.ModuleType("mmcv._ext")
    for name in ("modulated_deform_conv_forward", "modulated_deform_conv_backward",
                 "deform_conv_forward", "deform_conv_backward_input",
                 "deform_conv_backward_parameters"):
        setattr(ext, name, lambda *args, **kwargs: None)
    sys.modules["mmcv._ext"] = ext
    import mmcv.utils.ext_loader as loader
    loader.load_ext = lambda name, funcs: ext
    from mmcv.ops.deform_conv import DeformConv2dPack
    from mmcv.ops.modulated_deform_conv import ModulatedDeformConv2dPack
    return ModulatedDeformConv2dPack, DeformConv2dPack


def _torchvision_op():
    if shim := os.environ.get("TV_SHIM"):  # a CUDA-only torchvision wheel: see the docstring
        sys.path.insert(0, str(pathlib.Path(shim).parent))
        __import__(pathlib.Path(shim).stem)
    lib = torch.library.Library("torchvision", "FRAGMENT")
    lib.define("deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, "
               "Tensor bias, SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, "
               "SymInt dilation_h, SymInt dilation_w, SymInt groups, SymInt offset_groups, "
               "bool use_mask) -> Tensor")

    def shape_only(x, w, offset, mask, bias, sh, sw, ph, pw, dh, dw, groups, og, use_mask):
        return x.new_zeros((x.shape[0], w.shape[0], offset.shape[2], offset.shape[3]))

    lib.impl("deform_conv2d", shape_only, "CPU")
    torch.library.register_fake("torchvision::deform_conv2d")(shape_only)
    return lib


class _TorchvisionNet(torch.nn.Module):
    def __init__(self, mask: bool, stride: int, groups: int, offset_groups: int):
        import torchvision
        super().__init__()
        taps = offset_groups * 9
        self.offset = torch.nn.Conv2d(4, taps * (3 if mask else 2), 3, stride, 1)
        self.conv = torchvision.ops.DeformConv2d(4, 6, 3, stride, 1, groups=groups)
        self.taps, self.mask = taps, mask

    def forward(self, x):
        o = self.offset(x)
        if self.mask:
            return self.conv(x, o[:, :2 * self.taps], torch.sigmoid(o[:, 2 * self.taps:]))
        return self.conv(x, o)


def _seed(module: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    for p in module.parameters():
        p.data.normal_(0.0, 0.5)
    return module.eval()


def _export(module, name: str, dynamo: bool = False, **kwargs) -> None:
    x = torch.randn(1, 4, 8, 8)
    path = HERE / name
    if dynamo:
        torch.onnx.export(module, (x,), str(path), dynamo=True)
    else:
        torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"], **kwargs)
    model = onnx.load(str(path))  # inline any external data: one small file per export
    for extra in HERE.glob(name + ".data"):
        extra.unlink()
    onnx.save(model, str(path))
    print(name, [f"{n.domain}::{n.op_type}" for n in model.graph.node if n.domain])


def main() -> None:
    modulated, plain = _mmcv_modules()
    _export(_seed(modulated(4, 6, 3, padding=1, deform_groups=2)), "mmcv_modulated.onnx")
    _export(_seed(modulated(4, 6, 3, stride=2, padding=1, groups=2, bias=False)),
            "mmcv_modulated_s2_nobias.onnx")
    _export(_seed(plain(4, 6, 3, padding=1, deform_groups=2)), "mmcv_plain.onnx")
    library = _torchvision_op()  # the op lives as long as its Library object
    fall = torch.onnx.OperatorExportTypes.ONNX_FALLTHROUGH
    _export(_seed(_TorchvisionNet(True, 1, 2, 2)), "tv_fallthrough_mask.onnx",
            operator_export_type=fall)
    _export(_seed(_TorchvisionNet(False, 2, 1, 1)), "tv_fallthrough_nomask.onnx",
            operator_export_type=fall)
    _export(_seed(_TorchvisionNet(True, 1, 2, 2)), "tv_dynamo_mask.onnx", dynamo=True)
    del library


if __name__ == "__main__":
    main()
