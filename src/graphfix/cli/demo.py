"""`graphfix demo`: the default pipeline on a built-in sample, offline."""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer

from graphfix.cli.common import console, print_report, user_errors
from graphfix.passes.defaults import DEFAULT_PIPELINE


def demo_command(
    ctx: typer.Context,
    out_dir: Path = typer.Option(
        None, "--out-dir",
        help="Where to write the sample and its result (default: a new temporary directory).",
    ),
) -> None:
    """Build a sample Conv-BN-ReLU network, run the default pipeline with checks, show the table."""
    from graphfix import api, io, samples

    with user_errors(ctx):
        out_dir = out_dir or Path(tempfile.mkdtemp(prefix="graphfix-demo-"))
        out_dir.mkdir(parents=True, exist_ok=True)
        model = samples.conv_bn_relu_residual()
        src = out_dir / "conv_bn_relu_residual.onnx"
        dst = out_dir / "conv_bn_relu_residual.graphfix.onnx"
        io.save(model, src)
        result = api.run(src, DEFAULT_PIPELINE, check=True)
        io.save(result.model, dst, input_path=src)
        print_report(result.report)
        ops_before = sorted({n.op_type for n in model.graph.node})
        ops_after = sorted({n.op_type for n in result.model.graph.node})
        console.print(f"ops before: {', '.join(ops_before)}", markup=False)
        console.print(f"ops after:  {', '.join(ops_after)}", markup=False)
        console.print(f"input:  {src}\noutput: {dst}", markup=False)
