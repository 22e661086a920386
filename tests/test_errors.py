"""GraphfixError's message, and `said`: a library's exception in one line."""

from graphfix.errors import GraphfixError, said


def test_message_joins_what_why_fix_as_sentences():
    err = GraphfixError("Cannot read x.onnx.", "it is empty", "export it again")
    assert str(err) == "Cannot read x.onnx. It is empty. Export it again."


def test_said_takes_the_first_or_last_non_empty_line_and_caps_it():
    err = RuntimeError("\n  [E] parse failed  \n\nnode 'conv' has no weights\n")
    assert said(err) == "[E] parse failed"
    assert said(err, last=True) == "node 'conv' has no weights"
    assert said(ValueError("x" * 500)) == "x" * 300
    assert said(KeyError()) == "KeyError"
