"""What the command pages say that the typer app cannot: exit codes and JSON keys.

`graphfix.cli.docgen` renders these tables under each `docs/cli/<command>.md`;
tests/cli/test_docs_pages.py checks them against the code: every EXIT_ constant of
`cli.common` is listed, and each JSON table names exactly the top-level keys a real
result's `to_json()` has (a key marked `only` appears only with that flag).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphfix.cli.common import EXIT_FAILED, EXIT_INTERNAL, EXIT_USER_ERROR

EXIT_OK = 0

USER_ERROR = ("a user error, and nothing is written: a bad flag or value, a missing or "
              "malformed input, an output path that clashes with an input or another output, "
              "an old flag spelling (the error names the new one). One paragraph says what, "
              "why and how to fix it; `--debug` adds the traceback.")
INTERNAL = ("an internal error, a bug in graphfix (not in your model): the traceback and a "
            "request to report it.")


def _exits(ok: str, failed: str | None = None) -> dict[int, str]:
    codes = {EXIT_OK: ok}
    if failed is not None:
        codes[EXIT_FAILED] = failed
    codes.update({EXIT_USER_ERROR: USER_ERROR, EXIT_INTERNAL: INTERNAL})
    return codes


EXITS: dict[str, dict[int, str]] = {
    "run": _exits(
        "the result was written (a pass that was rolled back is reported, not an error).",
        "`--strict` and a pass was rolled back; or, with `--trt`, doctor findings at or above "
        "`--fail-on` (default error) remain after the run (the result is written first); "
        "or `--bisect` found a rewrite that breaks the numbers."),
    "doctor": _exits(
        "no finding at or above `--fail-on` (with the default, error: the target's parser "
        "takes the model).",
        "a finding at or above `--fail-on` exists (`--fail-on never`: never exit 1)."),
    "check": _exits(
        "the check passed: strict mode, every compared tensor agrees; sqnr mode, every graph "
        "output is at or above `--sqnr-threshold`; `--detections`, the detections match.",
        "the check failed (the JSON's `passed` is false): in strict mode a compared tensor "
        "disagrees, in sqnr mode a graph output is below `--sqnr-threshold`, with "
        "`--detections` the detections differ."),
    "calibrate": _exits("the Q/DQ model (and every other file asked for) was written."),
    "passes": _exits("the list was printed."),
    "plugins": _exits("the rules were listed, the plan written, or the plan applied."),
    "demo": _exits("the sample and its result were written and the pass table printed."),
}


@dataclass(frozen=True)
class Key:
    """A top-level JSON key; `only`: the flag without which it is absent ("" always there)."""

    name: str
    about: str
    only: str = ""


@dataclass(frozen=True)
class Schema:
    """One JSON document a command prints: `when` it prints this one instead of the
    first ("" for the first). `name`: its `schema` key ("": it has none)."""

    name: str
    source: str  # where the code builds it
    keys: tuple[Key, ...]
    when: str = ""


RUN = Schema("graphfix.run/1", "graphfix.report.Report.to_json", (
    Key("schema", '`"graphfix.run/1"`'),
    Key("pipeline", "the pipeline that ran, as text `--passes` takes"),
    Key("passes", "one object per pass run, in order: spec, status (applied, unchanged, rolled "
        "back), seconds, node counts, counts, notes, the check, the rollback reason and cause"),
    Key("check", "how outputs were checked (inputs, data, seed, providers, tolerances), or "
        "why the check was skipped (`enabled` false, `skipped_reason`)"),
    Key("verify_notes", "notes from the checks after the passes"),
    Key("renamed", "tensor renames the passes made, {old: new} (what `check` matches by)"),
    Key("removed", "tensors a pass merged away, {tensor: pass}"),
    Key("rounds", "rounds each preset ran, {preset: count}"),
    Key("explain", "with `--explain`: Conv chains before and after, the broken ones with "
        "the fix, the NMS regions ({} otherwise)"),
    Key("doctor", "with `--trt`: the result's `graphfix.doctor/1` diagnosis ({} otherwise)"),
    Key("seconds", "wall time of the run"),
    Key("input", "the model read: {path, sha256} ({} for an in-memory model)"),
    Key("output", "the model written: {path, sha256} ({} when none was written)"),
    Key("rewrite_limit", "`--max-rewrites` (null without it)"),
    Key("rewrites", "with `--max-rewrites`: every rewrite the limit allowed, {index, spec, "
        "label, step}"),
    Key("nodes_before", "nodes of the input model"),
    Key("nodes_after", "nodes of the result"),
    Key("tools", "versions of Python, the platform, graphfix and its dependencies (tensorrt "
        "when importable)"),
))

BISECT = Schema("graphfix.bisect/1", "graphfix.passes.bisect.Bisection.to_json", (
    Key("schema", '`"graphfix.bisect/1"`'),
    Key("pipeline", "the pipeline bisected, as text"),
    Key("rewrites", "how many rewrites the full run applies"),
    Key("culprit", "the first rewrite that breaks the numbers, {index, spec, label, step} "
        "(null when none does)"),
    Key("message", "why the culprit's run fails the output check"),
    Key("applied", "rewrites in the model written with `-o`"),
    Key("probes", "every run of the search: its rewrite limit and whether it broke"),
), when="--bisect")

DOCTOR = Schema("graphfix.doctor/1", "graphfix.doctor.findings.Diagnosis.to_json", (
    Key("schema", '`"graphfix.doctor/1"`'),
    Key("model", "the model examined"),
    Key("target", "{label, matrix, note}: the TensorRT version and the operator table used"),
    Key("parses", "whether the target's parser will take the model (no error finding)"),
    Key("verdict", "the one-line answer, as printed"),
    Key("counts", "findings per severity {error, warn, info}"),
    Key("node_counts", "distinct nodes the findings name, per severity"),
    Key("blocking_nodes", "the nodes of the error findings"),
    Key("findings", "every finding, error first: rule, severity, message, nodes, tensors, "
        "fact, fix"),
    Key("parser", "TensorRT's own parser: {verdict, errors} (null unless it ran)"),
    Key("seconds", "time taken"),
))

CHECK = Schema("graphfix.check/2", "graphfix.check.layerwise.LayerwiseReport.to_json", (
    Key("schema", '`"graphfix.check/2"`'),
    Key("mode", "strict or sqnr (auto resolved)"),
    Key("runtime", "where the candidate ran: onnxruntime or tensorrt"),
    Key("samples", "samples compared"),
    Key("chunks", "sets of exposed tensors run per sample (over 1 under `--memory-budget`)"),
    Key("sqnr_threshold", "`--sqnr-threshold`, in dB"),
    Key("outputs_ok", "every graph output agrees (the verdict in sqnr mode)"),
    Key("passed", "the verdict: it decides the exit code"),
    Key("first_divergence", "the first tensor that disagrees, in topological order, as in "
        "`tensors` (null when none)"),
    Key("origins", "nodes where the error starts, most amplifying first"),
    Key("sensitivity", "sqnr mode: the lowest-SQNR quantized tensors ([] in strict mode)"),
    Key("exclude_nodes", "sqnr mode: node names for `calibrate --exclude-nodes`"),
    Key("tensors", "every reference tensor: status and detail, max abs and rel error, SQNR, worst "
        "sample, ok"),
    Key("notes", "what the comparison left out or substituted, and why"),
    Key("doctor", "the candidate's `graphfix.doctor/1` diagnosis", only="--trt"),
))

DETECTIONS = Schema("graphfix.detections/1", "graphfix.nms.compare.DetectionReport.to_json", (
    Key("schema", '`"graphfix.detections/1"`'),
    Key("ok", "the verdict: every box matched both ways with the same class, equal counts"),
    Key("images", "images compared"),
    Key("count_a", "detections of REFERENCE"),
    Key("count_b", "detections of the candidate"),
    Key("matched_a", "fraction of REFERENCE's boxes matched"),
    Key("matched_b", "fraction of the candidate's boxes matched"),
    Key("min_iou", "the IoU a match needs"),
    Key("mean_iou", "mean IoU of the matches"),
    Key("class_agreement", "fraction of matches with the same class"),
    Key("max_score_diff", "largest score difference of a match"),
    Key("max_count_diff", "largest difference in detection count on one image"),
), when="--detections")

_CALIBRATE = "graphfix.calibration.session.summary"
CALIBRATE = Schema("graphfix.calibrate/2", _CALIBRATE, (
    Key("schema", '`"graphfix.calibrate/2"`'),
    Key("data", "the calibration data (and evaluation data) used, described"),
    Key("tensors", "tensors with statistics"),
    Key("stats_seconds", "time of the statistics pass"),
    Key("methods", "one row per method: seconds, clipped tensors, per-tensor choices, and "
        "with an evaluation SQNR, top-1 agreement, accuracy"),
    Key("recommended", "the method whose ranges the written model has"),
    Key("clipping", "tensors the chosen ranges clip over a bit worse than another method's"),
    Key("clipping_threshold_db", "the SQNR loss (dB) that counts as clipping"),
    Key("notes", "notes (the target version, a method written instead of auto, ...)"),
    Key("written", "every file written, with what it is"),
))

FROM_CACHE = Schema("graphfix.calibrate/2", "graphfix.calibration.command._from_cache", (
    Key("schema", '`"graphfix.calibrate/2"`'),
    Key("from_cache", "the calibration cache read"),
    Key("methods", "[] (no statistics)"),
    Key("recommended", '`"cache"`'),
    Key("clipping", "[]"),
    Key("notes", "[]"),
    Key("written", "every file written, with what it is"),
), when="--from-cache")

PASSES = Schema("", "graphfix.cli.passes.passes_command", (
    Key("default_pipeline", "the pipeline `run` runs without `--passes`"),
    Key("passes", "every pass: name, summary, options (name, type, default), option_syntax"),
    Key("presets", "every preset: name, summary, passes, max_rounds"),
))

PLUGINS_LIST = Schema("", "graphfix.cli.plugins.list_command", (
    Key("target", "the `--trt` version (null without it)"),
    Key("rules", "every substitution rule: rule, matches, plugin, source, at_target, summary"),
    Key("plugins", "every plugin spec: plugin, versions, status, deprecated_since, "
        "removed_in, reference, fields"),
))

SCHEMAS: dict[str, tuple[Schema, ...]] = {
    "run": (RUN, BISECT),
    "doctor": (DOCTOR,),
    "check": (CHECK, DETECTIONS),
    "calibrate": (CALIBRATE, FROM_CACHE),
    "passes": (PASSES,),
    "plugins": (PLUGINS_LIST,),
    "demo": (),
}

