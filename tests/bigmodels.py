"""A model just over the 2 GB protobuf limit whose weights cost no disk.

`write_sparse_model(directory)` writes `big.onnx` and `big.onnx.data`: four 512 MiB
float32 weights (MatMul, MatMul, Conv, MatMul) kept in external data, written as a
sparse file (seeks, one value per weight so that no two are equal, and a byte at the
end), so the weights read as zeros but for those values and take no disk blocks.
Small tensors (biases, BatchNormalization statistics, a Reshape shape) are inline and
non-zero, so the outputs are not all zero and `fold-bn` has a Conv +
BatchNormalization to fold (it reads the 512 MiB Conv weight). Also a script:
`python tests/bigmodels.py DIR` writes the model into DIR.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

N = 8192
"""The weights are N x 2N (and 2N x N): 2**27 float32 values, 512 MiB each."""
WEIGHT_NAMES = ("w1", "w2", "wc", "w3")


def weights_bytes(n: int = N) -> int:
    """Bytes of the external weights of `write_sparse_model(n=n)`."""
    return 4 * (4 * n * 2 * n)


def sparse_files_supported(directory: str | os.PathLike) -> bool:
    """Whether a file with a 64 MiB hole in `directory` takes (almost) no disk blocks."""
    probe = Path(directory) / ".sparse-probe"
    try:
        with open(probe, "wb") as f:
            f.seek(64 << 20)
            f.write(b"\0")
        return os.stat(probe).st_blocks * 512 < (1 << 20)
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


def write_sparse_model(directory: str | os.PathLike, n: int = N) -> Path:
    """Write `big.onnx` + `big.onnx.data` into `directory`; returns the model's path."""
    directory = Path(directory)
    path = directory / "big.onnx"
    big = [("w1", [n, 2 * n]), ("w2", [2 * n, n]), ("wc", [2 * n, n, 1, 1]), ("w3", [2 * n, n])]
    inits, offset = [], 0
    for name, dims in big:
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims,
                        data_location=TensorProto.EXTERNAL)
        length = 4 * int(np.prod(dims))
        for key, value in (("location", "big.onnx.data"), ("offset", offset),
                           ("length", length)):
            entry = t.external_data.add()
            entry.key, entry.value = key, str(value)
        inits.append(t)
        offset += length
    rng = np.random.default_rng(0)

    def small(name: str, values: np.ndarray) -> TensorProto:
        return numpy_helper.from_array(values.astype(np.float32), name)

    c = 2 * n
    inits += [small("b1", rng.standard_normal(2 * n)), small("b2", rng.standard_normal(n)),
              small("gamma", rng.uniform(0.5, 2, c)), small("beta", rng.standard_normal(c)),
              small("mean", rng.standard_normal(c)), small("var", rng.uniform(0.5, 2, c)),
              numpy_helper.from_array(np.array([1, n, 1, 1], np.int64), "to4d"),
              numpy_helper.from_array(np.array([1, 2 * n], np.int64), "to2d")]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        helper.make_node("Add", ["h1", "b1"], ["h1b"], name="add1"),
        helper.make_node("Relu", ["h1b"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["r1", "w2"], ["h2"], name="mm2"),
        helper.make_node("Add", ["h2", "b2"], ["h2b"], name="add2"),
        helper.make_node("Reshape", ["h2b", "to4d"], ["h4"], name="reshape4d"),
        helper.make_node("Conv", ["h4", "wc"], ["c"], name="conv", kernel_shape=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"],
                         ["bn"], name="bn"),
        helper.make_node("Reshape", ["bn", "to2d"], ["flat"], name="reshape2d"),
        helper.make_node("MatMul", ["flat", "w3"], ["y"], name="mm3"),
    ]
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, n])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, n])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    with open(directory / "big.onnx.data", "wb") as f:
        for i, t in enumerate(inits[:len(big)]):  # one value each, so no two weights are equal
            f.seek(int(t.external_data[1].value))
            f.write(np.float32(i + 1).tobytes())
        f.seek(offset - 1)
        f.write(b"\0")
    path.write_bytes(model.SerializeToString())
    onnx.checker.check_model(str(path))
    return path


if __name__ == "__main__":
    print(write_sparse_model(sys.argv[1]))
