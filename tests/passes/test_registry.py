import dataclasses
import re

import pytest

from graphfix.errors import GraphfixError, InternalError
from graphfix.passes.base import NoOptions, Pass
from graphfix.passes.registry import PASSES, REGISTRY, build_registry, get_pass


def test_registry_is_the_explicit_list():
    assert list(REGISTRY) == [cls.name for cls in PASSES]
    for cls in PASSES:
        assert re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", cls.name)
        assert cls.summary and dataclasses.is_dataclass(cls.Options)


def test_duplicate_name_is_a_programming_error():
    class Twin(Pass):
        name = "cleanup"
        summary = "a second cleanup"
        Options = NoOptions

    with pytest.raises(InternalError, match="two passes are named 'cleanup'"):
        build_registry(PASSES + (Twin,))


def test_malformed_name_is_a_programming_error():
    class Bad(Pass):
        name = "Bad_Name"
        summary = "x"

    with pytest.raises(InternalError, match="kebab-case"):
        build_registry((Bad,))


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
