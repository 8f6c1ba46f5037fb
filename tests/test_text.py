"""The one display rule for names (hookscope._text): shortened in the middle, numbers whole, never a crash."""

from __future__ import annotations

import doctest
import importlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hookscope._text import ELLIPSIS, MIN_WIDTH, display_name, neutralize, quoted, shorten, truncate, wrap

DIGITS = re.compile(r"\d+")


def digit_runs(text: str) -> list[str]:
    return DIGITS.findall(text)


names = st.text(alphabet="ab_.0123456789xyz", min_size=1, max_size=120)


@settings(max_examples=300, deadline=None)
@given(name=names, width=st.integers(MIN_WIDTH, 60))
def test_a_shortened_name_fits_keeps_its_ends_and_cuts_no_number(name: str, width: int) -> None:
    shown = shorten(name, width)
    assert len(shown) <= width
    if len(name) <= width:
        assert shown == name
        return
    head, mark, tail = shown.partition(ELLIPSIS)
    assert mark == ELLIPSIS and name.startswith(head) and name.endswith(tail)  # cut in the middle, once
    if max(map(len, digit_runs(name)), default=0) < width // 2:  # no number wider than the room on one side
        whole = digit_runs(name)
        assert all(run in whole for piece in (head, tail) for run in digit_runs(piece)), (name, shown)


@settings(max_examples=200, deadline=None)
@given(name=names, width=st.integers(MIN_WIDTH, 60))
def test_numbers_at_the_cut_are_kept_whole_or_dropped_whole(name: str, width: int) -> None:
    shown = shorten(name, width)
    if shown == name or max(map(len, digit_runs(name)), default=0) >= width // 2:
        return
    head, _, tail = shown.partition(ELLIPSIS)
    cut_left, cut_right = len(head), len(name) - len(tail)
    assert not (0 < cut_left < len(name) and name[cut_left - 1].isdigit() and name[cut_left].isdigit())
    assert not (0 < cut_right < len(name) and name[cut_right - 1].isdigit() and name[cut_right].isdigit())


def test_dotted_paths_lose_whole_middle_segments() -> None:
    path = "vit.encoder.layer.11.attention.attention.query"
    assert shorten(path, 34) == "vit.….11.attention.attention.query"
    assert shorten(path, 21) == "vit.….attention.query"
    assert shorten(path, 20) == "vit.….query"
    assert shorten(path, 12) == "vit.….query"
    assert shorten("encoder.layers.encoder_layer_11.self_attention", 30) == "encoder.….self_attention"
    assert shorten("x" * 20000, 40) == "x" * 20 + ELLIPSIS + "x" * 19


def test_ascii_marks_and_bad_widths() -> None:
    assert shorten("features.12.block.3.fc2", 16, "...") == "features...fc2"
    assert shorten("features.12.block.3.fc2", 16, "...").isascii()
    assert truncate("[2, 197, 768]", 9, "...") == "[2, ..."
    with pytest.raises(ValueError, match=r"width must be an int >= 8, got 3"):
        shorten("abc.def.ghi", 3)


def test_display_names_are_visible_encodable_and_name_the_root() -> None:
    assert display_name("") == "(root)" and quoted("") == "(root)"
    assert display_name("a\ud800b") == "a<U+D800>b"
    display_name("a\ud800b").encode("utf-8")  # a lone surrogate would raise UnicodeEncodeError
    assert neutralize("x\u202ey\x00") == "x<U+202E>y<U+0000>"
    assert quoted("layer 1.fc") == "'layer\u00a01.fc'"  # one word for wrap


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


@pytest.mark.parametrize("module", ["hookscope._text", "hookscope.watch._activity", "hookscope.plot._base"])
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
