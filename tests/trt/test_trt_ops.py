"""Operator-table lookups, checked against the data's own summaries and on ops whose
support changes between versions (chosen from `changes_between_versions`)."""

from __future__ import annotations

import pytest

from graphfix.trt import OpSupport, documented_versions, parse_target, parser_behaviour_notes
from graphfix.trt._data import operators_data


def test_every_row_agrees_with_support_by_op():
    """support_by_op: Y supported, Y* experimental, N listed unsupported, - not listed."""
    for op, by_version in operators_data()["support_by_op"].items():
        for version, letter in by_version.items():
            row = parse_target(version).op(op)
            if letter == "-":
                assert row is None, (op, version)
                continue
            assert row is not None and row.matrix == version, (op, version)
            assert (row.supported, row.experimental) == {
                "Y": (True, False), "Y*": (True, True), "N": (False, False)}[letter], (op, version)


def test_changes_between_versions_show_in_lookups():
    for change in operators_data()["changes_between_versions"]:
        before, after = parse_target(change["frm"]), parse_target(change["to"])
        for op in change["newly_listed"]:
            assert before.op(op) is None and after.op(op) is not None, op
        for op in change["became_supported"]:
            row = before.op(op)
            assert (row is None or not row.supported) and after.op(op).supported, op


def test_hardswish_newly_listed_in_8_4():
    assert parse_target("8.2").op("HardSwish") is None
    assert parse_target("8.4").op("HardSwish") == OpSupport(
        "HardSwish", True, False, ("FP32", "FP16"), "", "8.4")
    assert "HardSwish" in parse_target("8.4").listed_ops()
    assert "HardSwish" not in parse_target("8.2").listed_ops()


def test_nonzero_supported_from_8_5():
    assert not parse_target("8.4").op("NonZero").supported  # listed as N
    assert parse_target("8.5").op("NonZero").supported


def test_gelu_in_10_but_not_8_6():
    assert parse_target("8.6").op("Gelu") is None
    assert parse_target("10").op("Gelu").supported
    assert parse_target("10.12").op("Gelu").supported  # via the 10.1 table


def test_attention_only_from_10_16_table():
    assert parse_target("10.16").op("Attention").supported
    # 10.15 maps to the 10.1 table, which does not list Attention: conservative.
    assert parse_target("10.15").op("Attention") is None
    assert parse_target("11.1").op("Swish").supported
    assert parse_target("10.16").op("Swish") is None


def test_nms_experimental_until_8_4():
    row = parse_target("8.4").op("NonMaxSuppression")
    assert row.supported and row.experimental
    assert "must be initializers" in row.restrictions
    assert not parse_target("8.5").op("NonMaxSuppression").experimental


def test_restrictions_are_verbatim():
    row = parse_target("10.1").op("Loop")
    assert row.restrictions == (
        "Scan output length cannot be dynamic. The shape of Loop carried dependencies must "
        "be the same across all loop iterations.")
    assert parse_target("10.0").op("Loop").restrictions == ""


def test_types_keep_table_names_and_mend_upstream_slips():
    assert parse_target("10.16").op("Abs").types == ("FP32", "FP16", "BF16", "INT32", "INT64")
    # operators.md 10.0 writes "INT64 BOOL" without a comma for Split.
    assert parse_target("10.0").op("Split").types[-2:] == ("INT64", "BOOL")
    # 10.16/11.1 put a sentence in DynamicQuantizeLinear's types column.
    row = parse_target("11.1").op("DynamicQuantizeLinear")
    assert row.types == () and not row.supported
    assert row.restrictions.startswith("Not supported. TensorRT's IDynamicQuantize")
    every_type = {t for v in documented_versions() for op in parse_target(v).listed_ops()
                  for t in parse_target(v).op(op).types}
    assert every_type <= {"FP32", "FP16", "BF16", "FP8", "FP4", "INT64", "INT32", "INT8",
                          "INT4", "UINT8", "BOOL"}


def test_unknown_and_case_sensitive_ops_are_not_listed():
    target = parse_target("10.16")
    assert target.op("NoSuchOp") is None
    assert target.op("conv") is None and target.op("Conv").supported


@pytest.mark.parametrize(("version", "bounds"), [
    ("8.0", (1, 13)), ("8.6", (1, 17)), ("9.3", (1, 19)), ("10.1", (9, 20)),
    ("10.16", (9, 24)), ("11.1", (9, 24))])
def test_opset_range_from_header(version, bounds):
    assert parse_target(version).opset_range == bounds


def test_header_data_types_and_notes():
    assert parse_target("8.6").data_types == ("DOUBLE", "FLOAT32", "FLOAT16", "INT8", "BOOL")
    assert "INT64" in parse_target("10.1").data_types
    assert parse_target("8.6").header_notes[0].startswith("Note: There is limited support")


def test_parser_behaviour_notes_as_in_data_and_a_copy():
    notes = parser_behaviour_notes()
    assert notes == operators_data()["parser_behaviour_notes"]
    assert "8.5+" in notes["NonMaxSuppression"]
    notes["opset"] = "changed"
    assert parser_behaviour_notes()["opset"] != "changed"
