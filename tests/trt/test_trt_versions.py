"""TensorRT version text -> the documented operator table used for it."""

from __future__ import annotations

import sys
import types

import pytest

from graphfix.errors import GraphfixError
from graphfix.trt import TrtTarget, documented_versions, installed_tensorrt_version, parse_target

DOCUMENTED = ("8.0", "8.2", "8.4", "8.5", "8.6", "9.3", "10.0", "10.1", "10.16", "11.1")


def test_documented_versions_are_numerically_sorted():
    assert documented_versions() == DOCUMENTED  # 10.16 after 10.1, 11.1 last


@pytest.mark.parametrize("version", DOCUMENTED)
def test_every_documented_version_maps_to_itself(version):
    target = parse_target(version)
    assert (target.requested, target.version, target.effective) == (version, version, version)
    assert target.label() == f"TensorRT {version}"
    assert "is documented" in target.note


@pytest.mark.parametrize(
    ("text", "table"),
    [("10", "10.16"), ("11", "11.1"), ("9", "9.3"), ("8", "8.6"), ("10.12", "10.1"),
     ("8.3", "8.2"), ("8.6.1", "8.6"), ("10.16.0", "10.16"), ("11.0", "10.16"),
     ("10.20", "10.16"), ("12.0", "11.1"), ("12", "11.1"), (" v10.12 ", "10.1")],
)
def test_versions_map_to_nearest_documented_at_or_below(text, table):
    assert parse_target(text).version == table


def test_major_means_newest_documented_minor():
    target = parse_target("10")
    assert (target.requested, target.version, target.effective) == ("10", "10.16", "10.16")
    assert target.label() == "TensorRT 10.16"
    assert target.note == "TensorRT 10 means the newest documented 10.x; using the 10.16 matrix"


def test_undocumented_minor_uses_table_below_and_says_so():
    target = parse_target("10.12")
    assert target.note == ("TensorRT 10.12 is not documented; using the 10.1 matrix "
                           "(nearest documented at or below)")
    assert target.label() == "TensorRT 10.12 (matrix 10.1)"
    assert target.at_least("10.2") and target.at_least("10.12") and not target.at_least("10.13")
    assert target.major == 10


def test_newer_than_every_table_uses_newest_with_note():
    target = parse_target("12.0")
    assert target.version == "11.1"
    assert "newer than every documented version" in target.note
    assert target.label() == "TensorRT 12.0 (matrix 11.1)"
    assert target.major == 12 and target.at_least("11.1")


def test_at_least_is_numeric_not_textual():
    assert parse_target("10.16").at_least("10.2")  # "10.16" < "10.2" as text
    assert not parse_target("10.1").at_least("10.12")
    assert parse_target("10.1.0").at_least("10.1") and parse_target("10.1").at_least("10.1.0")
    assert not parse_target("8.6").at_least("9.0")


@pytest.mark.parametrize("text", ["7.2", "7", "abc", "", "  ", "10.x", "ten", "-10"])
def test_bad_or_too_old_text_is_a_user_error_listing_versions(text):
    with pytest.raises(GraphfixError) as info:
        parse_target(text)
    error = info.value
    assert error.what and error.why and error.fix
    assert ", ".join(DOCUMENTED) in error.why


def test_too_old_says_which_is_oldest():
    with pytest.raises(GraphfixError, match="older than the oldest documented version, 8.0"):
        parse_target("7.2")


def test_none_without_tensorrt_is_newest_documented(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt -> ImportError
    assert installed_tensorrt_version() is None
    target = parse_target(None)
    assert (target.requested, target.version) == ("newest documented", "11.1")
    assert "not installed" in target.note


def test_none_uses_installed_tensorrt(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="10.3.0"))
    assert installed_tensorrt_version() == "10.3.0"
    target = parse_target(None)
    assert (target.requested, target.version, target.effective) == (
        "installed 10.3.0", "10.1", "10.3.0")
    assert target.label() == "TensorRT 10.3.0 (matrix 10.1)"
    assert target.note.startswith("TensorRT 10.3.0 (installed) is not documented")


def test_installed_version_never_raises(monkeypatch):
    class Broken(types.ModuleType):
        @property
        def __version__(self):  # what a half-installed wheel can do
            raise RuntimeError("libnvinfer.so.10: cannot open shared object file")

    monkeypatch.setitem(sys.modules, "tensorrt", Broken("tensorrt"))
    assert installed_tensorrt_version() is None


def test_unreadable_installed_version_falls_back_to_newest(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="dev"))
    target = parse_target(None)
    assert target.version == "11.1" and "cannot read" in target.note


def test_target_rejects_undocumented_table():
    from graphfix.errors import InternalError

    with pytest.raises(InternalError):
        TrtTarget(requested="10.12", version="10.12", note="")
