"""``strict_json.parse``, the one reader of JSON files someone else wrote (a Hugging Face
folder's config, index and generation settings, a safetensors header): its depth count
(made without recursion, strings left out) is exact on any JSON, and every way the text
can break the parser is one :class:`~layerfit.strict_json.JSONTextError` line."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layerfit.strict_json import MAX_DEPTH, JSONTextError, nesting_depth, parse

_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                     max_leaves=30)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@given(_JSON, st.booleans())
def test_the_depth_count_is_exact_on_any_json(value: Any, ascii_only: bool):
    """Brackets, quotes and backslashes inside strings (keys too) are not nesting."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert nesting_depth(text) == _depth(value)
    assert parse(text, "x.json") == value


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("{" * 100_000, "nests 100,000 levels deep"),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"nests {MAX_DEPTH + 1} levels deep"),
        (b"\xff{}", "is not UTF-8 text"),
        ('{"a": ' + "9" * 5000 + "}", "is not valid JSON: Exceeds the limit"),
        ('{"a": 1', "is not valid JSON: Expecting"),
        ("x" * 101, "is 101 bytes, more than the 100"),
    ],
    ids=["100k nested {", "one past the limit", "not UTF-8", "5000-digit integer", "truncated", "too large"],
)
def test_broken_text_is_one_line(raw: str | bytes, words: str):
    with pytest.raises(JSONTextError) as refused:
        parse(raw, "config.json", max_bytes=100 if words.startswith("is 101") else 64 * 2**20)
    message = str(refused.value)
    assert message.startswith("config.json ") and words in message and "\n" not in message, message


def test_the_limit_itself_parses():
    text = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert nesting_depth(text) == MAX_DEPTH and parse(text, "x.json") is not None
