import dataclasses
import re
import subprocess
import sys

import pytest

from graphfix.errors import GraphfixError, InternalError
from graphfix.passes.base import Pass
from graphfix.passes.registry import PASSES, REGISTRY, LazyRegistry, get_pass


def test_registry_is_the_explicit_list():
    assert list(REGISTRY) == [cls.name for cls in PASSES]
    for cls in PASSES:
        assert re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", cls.name)
        assert cls.summary and dataclasses.is_dataclass(cls.Options)


def test_duplicate_name_is_a_programming_error():
    with pytest.raises(InternalError, match="two passes are named 'cleanup'"):
        LazyRegistry((("cleanup", "cleanup:Cleanup"), ("cleanup", "fold_bn:FoldBatchNorm")))


def test_malformed_name_is_a_programming_error():
    class Bad(Pass):
        name = "Bad_Name"
        summary = "x"

    registry = LazyRegistry(())
    registry["bad-name"] = Bad
    with pytest.raises(InternalError, match="kebab-case"):
        registry["bad-name"]


def test_a_class_listed_under_another_name_is_a_programming_error():
    registry = LazyRegistry((("fold-batchnorm", "fold_bn:FoldBatchNorm"),))
    assert list(registry) == ["fold-batchnorm"]
    with pytest.raises(InternalError, match="named 'fold-bn' but listed as 'fold-batchnorm'"):
        registry["fold-batchnorm"]


def test_a_pass_module_loads_when_the_pass_is_looked_up():
    """The registry names every pass without importing them: the default pipeline's run
    loads only its own passes (start-up time)."""
    code = ("import sys; from graphfix.passes import registry; "
            "assert 'add-nms' in registry.REGISTRY and 'graphfix.passes.add_nms' not in "
            "sys.modules; registry.get_pass('add-nms'); "
            "assert 'graphfix.passes.add_nms' in sys.modules; "
            "from graphfix.passes.pipeline import parse_pipeline; parse_pipeline('trt-prep'); "
            "assert 'graphfix.passes.split_nms' not in sys.modules, 'trt-prep loaded split-nms'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_name_is_a_user_error_with_suggestions():
    with pytest.raises(GraphfixError, match="did you mean 'fix-shapes'"):
        get_pass("fix-shape")


def test_unknown_name_without_close_match_lists_passes():
    with pytest.raises(GraphfixError, match="The passes are: cleanup"):
        get_pass("zzzz")


@pytest.mark.parametrize("name", ["frob", "relu-fuse", "quantize"])
def test_a_name_with_little_in_common_gets_no_suggestion(name):
    with pytest.raises(GraphfixError) as err:
        get_pass(name)
    assert "did you mean" not in err.value.message and "The passes are" in err.value.message
