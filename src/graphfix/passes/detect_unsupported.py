"""detect-unsupported: record what TensorRT would reject (graphfix doctor), change nothing.

    graph -> graph, notes += doctor findings (errors and warnings)

The target is the pass option `trt` ("8.6", "10", ...), else the run's target
(`graphfix run --trt`), else the installed tensorrt's version, else the newest
documented one. Each finding becomes a note "severity rule-id: message (fix: ...)"
on its first node (or "model"); info findings are counted, not listed.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from graphfix.graph.convert import export
from graphfix.passes.base import Note, Pass, PassContext, PassResult


@dataclass(frozen=True)
class DetectUnsupportedOptions:
    trt: str = ""


class DetectUnsupported(Pass):
    """Run doctor's rules on the graph as it is at this point of the pipeline.

    Never changes the graph (changed=False); its notes are the findings, so a
    pipeline can show what is left after the fixing passes
    (`--passes trt-prep,detect-unsupported{trt=8.6}`).
    """

    name = "detect-unsupported"
    summary = "Record what TensorRT would reject here (graphfix doctor's findings); change nothing."
    Options = DetectUnsupportedOptions

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        from graphfix.doctor import INFO, diagnose
        from graphfix.trt import parse_target

        target = parse_target(self.options.trt) if self.options.trt else (
            ctx.trt or parse_target(None))
        model = export(graph)
        diagnosis = diagnose(model, target)
        result = PassResult(changed=False)
        infos = 0
        for f in diagnosis.findings:
            if f.severity == INFO:
                infos += 1
                continue
            fix = f" (fix: {f.fix})" if f.fix else ""
            where = f.nodes[0] + (f" and {len(f.nodes) - 1} more" if len(f.nodes) > 1 else "") \
                if f.nodes else "model"
            result.notes.append(Note(where, f"{f.severity} {f.rule}: {f.message}{fix}"))
        result.notes.append(Note("graph", f"{diagnosis.verdict()}; {infos} info finding(s) "
                                          "not listed (graphfix doctor --info)"))
        return result
