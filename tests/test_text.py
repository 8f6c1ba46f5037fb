"""The one display rule for names (hookscope._text, re-exported by hookscope.summary): shortened in the middle,
numbers whole, never a crash."""

from __future__ import annotations

import doctest
import importlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hookscope._text import ELLIPSIS, display_name, neutralize, quoted, shorten_end, shorten_middle, shorten_path, wrap

DIGITS = re.compile(r"\d+")

names = st.text(alphabet="ab_.0123456789xyz", min_size=1, max_size=120)


def pieces(shown: str) -> list[str]:
    return shown.split(ELLIPSIS)


@settings(max_examples=300, deadline=None)
@given(name=names, width=st.integers(8, 60))
def test_a_shortened_path_fits_and_keeps_what_it_shows_in_order(name: str, width: int) -> None:
    shown = shorten_path(name, width)
    assert len(shown) <= width
    if len(name) <= width:
        assert shown == name
        return
    parts = pieces(shown)
    assert name.startswith(parts[0]) and name.endswith(parts[-1])  # the ends are kept, the middle is cut
    position = 0
    for part in parts:  # every piece shown is in the name, in order
        found = name.find(part, position)
        assert found >= 0, (name, shown)
        position = found + len(part)


@settings(max_examples=300, deadline=None)
@given(name=names, width=st.integers(8, 60))
def test_no_number_is_cut_when_the_room_allows(name: str, width: int) -> None:
    longest = max(map(len, DIGITS.findall(name)), default=0)
    if longest * 4 >= width:  # a number this long may have to be cut: the rule says "when it can help it"
        return
    whole = set(DIGITS.findall(name))
    for shown in (shorten_path(name, width), shorten_middle(name, width)):
        assert set(DIGITS.findall(shown.replace(ELLIPSIS, " "))) <= whole, (name, width, shown)


def test_dotted_paths_lose_whole_middle_segments() -> None:
    path = "vit.encoder.layer.11.attention.attention.query"
    assert shorten_path(path, 34) == "vit.…11.attention.attention.query"
    assert shorten_path(path, 21) == "vit.…attention.query"
    assert shorten_path(path, 12) == "vit.…query"
    assert shorten_path("encoder.layers.encoder_layer_11.self_attention", 30) == "encoder.…self_attention"
    assert shorten_path("x" * 20000, 40) == "x" * 20 + ELLIPSIS + "x" * 19
    assert shorten_middle("block_123456789_tail", 16) == "block_…_tail"  # the number is dropped whole
    assert shorten_end("[2, 197, 768]", 9, "...") == "[2, ..."


def test_the_summary_tables_use_the_same_rule() -> None:
    summary_package = importlib.import_module("hookscope.summary._render")  # what draws the tables
    assert summary_package.shorten_path is shorten_path
    assert summary_package.shorten_middle is shorten_middle and summary_package.shorten_end is shorten_end


def test_display_names_are_visible_encodable_and_name_the_root() -> None:
    assert display_name("") == "(root)" and quoted("") == "(root)"
    assert display_name("a\ud800b") == "a<U+D800>b"
    display_name("a\ud800b").encode("utf-8")  # a lone surrogate would raise UnicodeEncodeError
    assert neutralize("x\u202ey\x00") == "x<U+202E>y<U+0000>"
    assert quoted("layer 1.fc") == "'layer\u00a01.fc'"  # one word for wrap
    assert display_name("encoder.layers.11.self_attn.out_proj", 24) == "encoder.…out_proj"


@settings(max_examples=100, deadline=None)
@given(
    words=st.lists(st.text(alphabet="ab.1_", min_size=1, max_size=70), min_size=1, max_size=30),
    width=st.integers(40, 120),
)
def test_wrapped_lines_fit_and_keep_every_short_word(words: list[str], width: int) -> None:
    lines = wrap(" ".join(words), width, first="> ", indent="    ")
    assert all(len(line) <= width for line in lines) and lines[0].startswith("> ")
    joined = " ".join([lines[0][2:], *lines[1:]]).split()
    short = [w for w in words if len(w) <= width - 4]  # the room left by the indent
    assert [w for w in joined if ELLIPSIS not in w] == short  # the long ones are shortened, in place


@pytest.mark.parametrize("module", ["hookscope._text", "hookscope.results._activity", "hookscope.plot._base"])
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
