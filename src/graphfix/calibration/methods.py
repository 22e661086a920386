"""The calibration methods, each defined once: name, amax function, options, cache header, help.

Everything that lists or checks methods derives from `METHODS`: `graphfix calibrate
--method` (its help text and validation), `--method all`, `--per-tensor`, the header
of the legacy TensorRT cache, and the method table in docs/calibrate.md
(tests/calibration/test_methods.py holds each of them to this list).

`auto`, the default, is not a formula of its own: per tensor, it takes the amax of
whichever method in `AUTO_CHOICES` gives the lowest simulated INT8 quantization error
(`algorithms.quantization_mse`) on that tensor's histogram, ties to the earlier one.
`mse` minimizes that same error over the bin edges from bin 128 up, so it wins most
tensors; another method wins where it lands on the same point (ties) or below bin 128.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from graphfix.calibration import algorithms
from graphfix.calibration.cache import DEFAULT_ALGORITHM as ENTROPY2
from graphfix.errors import GraphfixError

if TYPE_CHECKING:  # stats imports onnx and onnxruntime; the CLI's help needs only this list
    from graphfix.calibration.stats import TensorStats


@dataclass(frozen=True)
class Option:
    """A method's numeric option: the amax function's keyword and the CLI flag for it."""

    keyword: str
    flag: str
    default: float
    low: float  # exclusive
    high: float  # inclusive
    help: str

    def check(self, value: float) -> float:
        if not self.low < value <= self.high:
            raise GraphfixError(
                f"{self.flag} {value:g} is out of range",
                f"it must be in ({self.low:g}, {self.high:g}]: {self.help}",
                f"give a value in that range (the default is {self.default:g})",
            )
        return float(value)


@dataclass(frozen=True)
class Method:
    """One calibration method. `amax(stats, **options)` gives a tensor's symmetric range;
    None for `auto`, which picks per tensor among other methods (`ranges`)."""

    name: str
    help: str
    cache_algorithm: str  # the TensorRT calibrator named in a legacy cache's header
    amax: Callable[..., float] | None = None
    options: tuple[Option, ...] = ()
    exact_histogram: bool = False  # needs the two-pass histogram on [0, amax], see stats


PERCENTILE = Option("p", "--percentile", 99.99, 0.0, 100.0,
                    "the share (in %) of abs(x) counts kept inside the range")

AUTO_CHOICES = ("minmax", "percentile", "entropy", "mse")  # ties go to the earlier one
METHODS: tuple[Method, ...] = (
    Method("auto", f"per tensor, whichever of {', '.join(AUTO_CHOICES)} gives the lowest "
           "simulated INT8 error (the default)", ENTROPY2),
    Method("entropy", "TensorRT's EntropyCalibrator2 KL search, on the exact histogram "
           "(TensorRT's scales; may clip hard)", ENTROPY2, algorithms.entropy,
           exact_histogram=True),
    Method("minmax", "the observed max abs(x) (TensorRT's MinMaxCalibrator)", "MinMaxCalibration",
           algorithms.minmax),
    Method("percentile", "the range holding --percentile % of the abs(x) counts", ENTROPY2,
           algorithms.percentile, (PERCENTILE,)),
    Method("mse", "the range with the lowest simulated INT8 mean squared error", ENTROPY2,
           algorithms.mse),
)
DEFAULT = "auto"
_BY_NAME = {m.name: m for m in METHODS}
if len(_BY_NAME) != len(METHODS):
    raise RuntimeError("two calibration methods share a name")


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def get(name: str) -> Method:
    if name not in _BY_NAME:
        near = difflib.get_close_matches(name, list(_BY_NAME), n=1)
        raise GraphfixError(
            f"Unknown calibration method '{name}'",
            f"graphfix knows {', '.join(_BY_NAME)}",
            f"did you mean '{near[0]}'? " if near else "pick one of those, or all",
        )
    return _BY_NAME[name]


def parse(text: str) -> tuple[str, ...]:
    """`--method`: one name, a comma-separated list, or `all` (every method)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return tuple(_BY_NAME)
    if not names:
        raise GraphfixError("No calibration method given", "--method is empty",
                            f"give one of {', '.join(_BY_NAME)}, or all")
    return tuple(dict.fromkeys(get(n).name for n in names))


def cli_help() -> str:
    listed = "; ".join(f"{m.name}: {m.help}" for m in METHODS)
    return (f"{listed}. Several, comma-separated, or all: each from the one statistics pass, "
            "compared on held-apart samples.")


def options_for(values: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """Per method, its options' values: `values` maps a flag ('--percentile') to the
    user's value; each is checked against its range here, before any work."""
    out: dict[str, dict[str, float]] = {}
    for method in METHODS:
        out[method.name] = {o.keyword: o.check(values.get(o.flag, o.default))
                            for o in method.options}
    return out


@dataclass
class Ranges:
    """One method's result: amax per tensor, and for a per-tensor choice, which method
    gave each amax."""

    method: str
    amaxes: dict[str, float]
    chosen: dict[str, str] = field(default_factory=dict)


def plain_ranges(stats: Mapping[str, TensorStats],
                 options: Mapping[str, Mapping[str, float]]) -> dict[str, Ranges]:
    """Every method that has an amax function, on every tensor (`options` as from
    `options_for`): what `choose` and `clipping` compare."""
    return {m.name: Ranges(m.name, {name: m.amax(s, **options.get(m.name, {}))
                                    for name, s in stats.items()})
            for m in METHODS if m.amax is not None}


def choose(stats: Mapping[str, TensorStats], plain: Mapping[str, Ranges],
           choices: Sequence[str] = AUTO_CHOICES, label: str = "auto") -> Ranges:
    """Per tensor, the amax among `choices` (names in `plain`) with the lowest simulated
    quantization error; ties go to the earlier choice."""
    missing = [c for c in choices if c not in plain]
    if missing:
        raise GraphfixError(f"cannot choose per tensor among {', '.join(choices)}",
                            f"{', '.join(missing)} has no range formula of its own",
                            f"choose among {', '.join(plain)}")
    out = Ranges(label, {})
    for name, s in stats.items():
        amaxes = [plain[c].amaxes[name] for c in choices]
        k = int(np.argmin(algorithms.quantization_mse(s, amaxes)))
        out.amaxes[name], out.chosen[name] = amaxes[k], choices[k]
    return out


def markdown_table() -> str:
    """The method table of docs/calibrate.md."""
    rows = ["| method | what it does | options | cache header |", "|---|---|---|---|"]
    for m in METHODS:
        opts = ", ".join(f"`{o.flag}` (default {o.default:g})" for o in m.options) or "-"
        rows.append(f"| `{m.name}` | {m.help} | {opts} | {m.cache_algorithm} |")
    return "\n".join(rows)
