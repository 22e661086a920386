"""The verdict's detection table: each deliberately wrong rewrite (tests/mutants.py) on
the shared models, the deep test network and small built-in models.

    python bench/mutations.py            # prints the Markdown table of docs/verdict.md

Rows are the (mutant, model) pairs where the mutant changes the pass's result (a
ConvTranspose mutant on a model without ConvTranspose is left out). Per row: the verdict
on the mutated pass (graphfix.run with its check, seed 0) and the numbers behind it: the
mutant's error and the correct rewrite's error as max|c - r| / max|r| of the worst
output, and the bound the verdict applied (the larger of the fp32 scale bound and 10x
the model's noise floor, over the same scale). margin = mutant error / bound: above 1 is
caught.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import graphfix  # noqa: E402
from graphfix.report import APPLIED, ROLLED_BACK  # noqa: E402
from graphfix.runtime.feeds import graph_inputs, random_feeds, resolve_shapes  # noqa: E402
from graphfix.runtime.outputs import OutputCheck  # noqa: E402
from graphfix.runtime.session import run_model  # noqa: E402
from graphfix.runtime.tolerances import tolerance_for  # noqa: E402
from graphfix.samples import deep_resnet  # noqa: E402
from mutants import BUILT, MUTANTS, Mutant  # noqa: E402

SHARED = ROOT.parent / "shared" / "models"
SHAPES = {"ch_ppocr_mobile_v2.0_cls_infer": {"x": (1, 3, 48, 192)}}
SHARED_NAMES = ["mobilenet_v3_small_bn", "ch_ppocr_mobile_v2.0_cls_infer", "digits_dev",
                "digits_silu_dev", "digits_hswish_dev", "ssdlite320_mobilenet_v3_large"]


@dataclass
class Row:
    mutant: str
    model: str
    applies: bool
    caught: bool
    mutant_error: float
    correct_error: float
    bound: float

    @property
    def margin(self) -> float:
        return self.mutant_error / self.bound if self.bound else math.inf


def models() -> dict[str, onnx.ModelProto]:
    found = {"deep-resnet-0": deep_resnet(seed=0), "deep-resnet-1": deep_resnet(seed=1)}
    for name in SHARED_NAMES:
        path = SHARED / f"{name}.onnx"
        if path.exists():
            found[name] = onnx.load(str(path))
    found.update({name: build() for name, build in BUILT.items()})
    return found


def _scaled(check: OutputCheck, model: onnx.ModelProto) -> tuple[float, float]:
    """(max over float outputs of max|c - r| / max|r|, the bound over the same scale)."""
    outcome = check.verify(model)
    worst, bound = 0.0, tolerance_for("float32").scale
    for diff in outcome.diffs:
        m = diff.measure
        if m is None:
            return math.inf, bound
        if m.scale > 0 and m.tolerance is not None and m.tolerance.scale > 0:
            worst = max(worst, m.error)
            bound = max(bound, m.allowed / m.scale)
        elif m.max_abs > 0:
            worst = math.inf
    return worst, bound


def measure(mutant: Mutant, name: str, model: onnx.ModelProto, seed: int = 0) -> Row:
    shapes = SHAPES.get(name, {})
    plain = graphfix.run(model, passes=mutant.passes, check=False, input_shapes=shapes)
    correct, applies = plain.model, any(r.status == APPLIED for r in plain.report.passes)
    inputs = graph_inputs(model)
    feeds = random_feeds(inputs, resolve_shapes(inputs, shapes), seed)
    output_check = OutputCheck(feeds, run_model(model, feeds), seed=seed)
    output_check.measure_floor(model)
    with mutant.patch():
        verdict = graphfix.run(model, passes=mutant.passes, seed=seed, input_shapes=shapes)
    with mutant.patch():
        wrong = graphfix.run(model, passes=mutant.passes, check=False, input_shapes=shapes).model
    caught = any(r.status == ROLLED_BACK for r in verdict.report.passes)
    applies = applies and wrong.SerializeToString() != correct.SerializeToString()
    mutant_error, bound = _scaled(output_check, wrong)
    correct_error, _ = _scaled(output_check, correct)
    return Row(mutant.name, name, applies, caught, mutant_error, correct_error, bound)


def table(rows: list[Row]) -> str:
    lines = ["| mutant | model | caught | mutant error | correct rewrite | bound | margin |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r.applies:
            continue
        lines.append(f"| {r.mutant} | {r.model} | {'yes' if r.caught else '**no**'} | "
                     f"{r.mutant_error:.2g} | {r.correct_error:.2g} | {r.bound:.2g} | "
                     f"{r.margin:.3g} |")
    return "\n".join(lines)


def main() -> None:
    rows = []
    found = models()
    for mutant in MUTANTS:
        for name, model in found.items():
            rows.append(measure(mutant, name, model))
            print(f"{mutant.name} {name}: {rows[-1]}", file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
