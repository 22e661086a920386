"""Shared by the plugin tests: a user rule file's text (MyOp in domain my.ops ->
MyPlugin_TRT, a plugin graphfix does not know, so the rule declares its fields)."""

USER_PY = '''
from graphfix.plugins.rules import Match, Replacement, Rule

def _rewrite(match):
    node = match.anchor
    return Replacement(list(node.inputs), list(node.outputs),
                       {"alpha": node.attrs.get("alpha", 0.5), "size": 3})

RULES = [Rule(name="myop-to-plugin", summary="my.ops::MyOp -> MyPlugin_TRT",
              plugin="MyPlugin_TRT", anchor="MyOp", domain="my.ops",
              pattern=lambda node: Match([node]), rewrite=_rewrite,
              declared={"alpha": "float32", "size": "int32"})]
'''
