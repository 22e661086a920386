"""Helpers for the HTML report tests: parse a page strictly into a small element tree, and
check what every report page must be (balanced, self-contained, inert, its JSON intact)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"meta", "br", "hr", "img", "input", "link", "wbr"}
HOSTILE = "<script>alert(1)</script>\x1b[2J\u202eevil"
HOSTILE_SHOWN = "<script>alert(1)</script>\\x1b[2J\\u202eevil"  # text.printable's spelling


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)  # own text and children's, in order

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        return "".join(self.parts)

    def iter(self, tag: str | None = None, cls: str | None = None):
        """Every element below this one (depth first), filtered by tag and class."""
        for child in self.children:
            if (tag is None or child.tag == tag) and (cls is None or cls in child.classes):
                yield child
            yield from child.iter(tag, cls)

    def find(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> Element:
        found = [e for e in self.iter(tag, cls) if all(e.attrs.get(k) == v
                                                        for k, v in attrs.items())]
        assert found, (tag, cls, attrs)
        return found[0]


class _Tree(HTMLParser):
    """Builds the tree; an end tag that does not close the innermost open element fails."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {})
        self.stack = [self.root]
        self.doctype = ""

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl

    def handle_starttag(self, tag, attrs) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag, attrs) -> None:
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag) -> None:
        assert tag not in VOID, tag
        open_tag = self.stack[-1].tag
        assert open_tag == tag, f"</{tag}> closes <{open_tag}>"
        done = self.stack.pop()
        self.stack[-1].parts.append(done.text())

    def handle_data(self, data) -> None:
        self.stack[-1].parts.append(data)


def parse_page(page: str) -> Element:
    """The page's tree, after checking what every report page must be."""
    tree = _Tree()
    tree.feed(page)
    tree.close()
    assert tree.stack == [tree.root], [e.tag for e in tree.stack]
    assert tree.doctype.lower() == "doctype html" and page.startswith("<!DOCTYPE html>")
    (html,) = [e for e in tree.root.children if e.tag == "html"]
    assert [c.tag for c in html.children] == ["head", "body"]
    for svg in re.findall(r"<svg\b.*?</svg>", page, flags=re.S):
        ET.fromstring(svg)  # each plot is well-formed XML too
    for bad in ("http://", "https://", "<link", "@import", "url(", " src=", "<iframe",
                "<img", "javascript:"):
        assert bad not in page, bad
    scripts = list(tree.root.iter("script"))
    assert [s.attrs for s in scripts] == [{"type": "application/json", "id": "graphfix-data"}]
    assert not any(k.startswith("on") for e in tree.root.iter() for k in e.attrs)
    return tree.root


def page_data(root: Element) -> dict:
    """The JSON block's data (raises when it does not parse)."""
    return json.loads(root.find("script", id="graphfix-data").text())


def assert_hostile_name_is_inert(page: str) -> None:
    """The hostile name is in the page only escaped: no tag, no control or bidi character."""
    assert "<script>alert" not in page and "\x1b" not in page and "\u202e" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b[2J\\u202eevil" in page
    assert all(ch in "\n" or ord(ch) >= 32 for ch in page)
