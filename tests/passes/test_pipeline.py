import pytest

from graphfix.errors import GraphfixError
from graphfix.passes.pipeline import parse_pipeline
from graphfix.passes.registry import DEFAULT_PIPELINE


@pytest.mark.parametrize("text", [
    "cleanup",
    DEFAULT_PIPELINE,
    "cleanup,fold-bn,fix-shapes{input=1x3x224x224}",
    "fold-constants{size-threshold=1024,shapes=false},fix-shapes{x=1x3x48x192,mask=1x48}",
])
def test_parse_then_print_gives_the_same_text(text):
    assert str(parse_pipeline(text)) == text


def test_whitespace_is_ignored_and_printing_is_canonical():
    text = " cleanup , fold-constants { size-threshold = 1024 } "
    assert str(parse_pipeline(text)) == "cleanup,fold-constants{size-threshold=1024}"


def test_options_reach_the_pass():
    (spec,) = parse_pipeline("fold-constants{size-threshold=1024,shapes=false}").pass_specs()
    pass_ = spec.build()
    assert pass_.options.size_threshold == 1024
    assert pass_.options.shapes is False


def test_unknown_pass_suggests_the_nearest_names():
    with pytest.raises(GraphfixError, match="did you mean 'fold-bn'"):
        parse_pipeline("cleanup,fold-nb")


def test_unknown_option_lists_the_options():
    with pytest.raises(GraphfixError, match="no option 'size'.*size-threshold"):
        parse_pipeline("fold-constants{size=1}")


def test_badly_typed_option_says_the_type():
    with pytest.raises(GraphfixError, match="takes a int"):
        parse_pipeline("fold-constants{size-threshold=big}")


@pytest.mark.parametrize("text, problem", [
    ("", "empty"),
    ("cleanup,", "ends with ','"),
    ("cleanup,,fold-bn", "expected a pass name"),
    ("fold-bn{", "never closed"),
    ("fold-constants{size-threshold}", "key=value"),
    ("fold-constants{shapes=true,shapes=false}", "given twice"),
    ("cleanup fold-bn", "expected ','"),
    ("Cleanup", "expected a pass name"),
])
def test_bad_syntax_is_a_clear_error(text, problem):
    with pytest.raises(GraphfixError, match="Cannot parse the pipeline") as info:
        parse_pipeline(text)
    assert problem.lower() in str(info.value).lower()
