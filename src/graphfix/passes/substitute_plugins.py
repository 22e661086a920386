"""`substitute-plugins`: ops the --trt target cannot parse become TensorRT plugin nodes,
by the rules of `graphfix.plugins.substitute` plus user rules (`graphfix.plugins.user`).

Which rule applies where is decided per target by `graphfix.plugins.rules.search` (see
its module docstring): by default only where the target lacks native support; `force`
regardless; `needed-only` (the `--trt` default pipeline) only where the matched ops do not
parse at all. Every candidate left alone gets a note saying why.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from graphfix.errors import GraphfixError
from graphfix.passes.base import LIMIT_REACHED, Note, Pass, PassContext, PassResult
from graphfix.plugins.rules import Rule, apply, search


@dataclass(frozen=True)
class SubstituteOptions:
    rules: str = ""  # a user rule file (.py, .yaml/.yml), after the built-in rules
    force: bool = False
    select: str = ""  # rule names joined by '+'; default: every rule
    needed_only: bool = False


def rules_for(graph: gs.Graph, ctx: PassContext, options: SubstituteOptions) -> list[Rule]:
    """The built-in rules, installed entry points' rules, the run's user rules
    (--plugin-rules), then `rules=`;
    narrowed by `select`."""
    from graphfix.plugins.user import all_rules

    rules = all_rules(graph.opset or 17, ctx.plugin_rules,
                      [options.rules] if options.rules else [])
    if not options.select:
        return rules
    wanted = [s for s in options.select.split("+") if s]
    unknown = [s for s in wanted if s not in {r.name for r in rules}]
    if unknown:
        raise GraphfixError(
            f"substitute-plugins{{select=...}} names unknown rules: {', '.join(unknown)}",
            f"the rules are: {', '.join(r.name for r in rules)}",
            "fix the names (graphfix plugins list shows them)")
    return [r for r in rules if r.name in wanted]


class SubstitutePlugins(Pass):
    name = "substitute-plugins"
    summary = ("Replace ops the --trt target cannot parse (RoiAlign before 8.5, DeformConv "
               "before 10.1, ...) by TensorRT plugin nodes, by rule; user rules with "
               "rules=FILE or --plugin-rules.")
    Options = SubstituteOptions
    counts_rewrites = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        opt = self.options
        result = PassResult(changed=False)
        if ctx.trt is None and not opt.force:
            result.notes.append(Note("substitute-plugins", "no --trt target: which ops need a "
                                     "plugin depends on it (or give force=true)"))
            return result
        found, skipped = search(graph, rules_for(graph, ctx, opt), ctx.trt, force=opt.force,
                                needed_only=opt.needed_only)
        result.notes += [Note(s.subject, s.reason) for s in skipped]
        for item in found:
            anchor = item.match.anchor
            if not ctx.allow_rewrite(self.name, f"{anchor.op} '{anchor.name}' -> "
                                                f"{item.rule.plugin}"):
                result.notes.append(Note(f"{anchor.op} '{anchor.name}'", LIMIT_REACHED))
                continue
            apply(graph, item, target=ctx.trt)
            result.changed = True
            result.counts[f"{item.rule.name}: {anchor.op} -> {item.rule.plugin}"] += 1
        if not found and not skipped:
            result.notes.append(Note("substitute-plugins", "no node matches any rule"))
        return result
