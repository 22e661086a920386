"""The default pipelines' text, apart from the registry so the CLI can show it without
importing every pass."""

DEFAULT_PIPELINE = "trt-prep"
# With --trt V and no --passes: plugins the target no longer ships go back to ONNX ops,
# the usual preparation runs, then ops the target lacks are lowered to ops it has (native
# ops first; after trt-prep, whose normalize-activations would fuse a lowered HardSwish
# back), only what neither can handle becomes a plugin node (needed-only: a plugin
# chosen for speed is the user's call), and last a model outside the opsets the target
# parses is converted into them (after the lowering: Gelu-20 has no opset-17 form until
# it is lowered; plugin nodes are held out of the conversion). trt-tidy last folds,
# cleans and shares what those passes wrote (each lowered Gelu its own 0.5, 1,
# sqrt(1/2); a function body's shape arithmetic) without normalize-activations, which
# would fuse a lowering back, so the output is a fixed point: a second run changes nothing.
TRT_PIPELINE = ("migrate-plugins,trt-prep,lower-unsupported,"
                "substitute-plugins{needed-only=true},opset{to-target=true},trt-tidy")


def default_pipeline(trt: str | None) -> str:
    """The pipeline `graphfix run` uses when --passes is not given."""
    return TRT_PIPELINE if trt is not None else DEFAULT_PIPELINE
