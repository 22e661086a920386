"""The default pipeline's name, apart from the registry so the CLI can show it without
importing every pass."""

DEFAULT_PIPELINE = "trt-prep"
