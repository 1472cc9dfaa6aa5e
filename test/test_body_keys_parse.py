"""The body parse (nomyo_router/api/body_keys.py), in-process: every JSON object parses as
json.loads reads it or is refused naming the key (a key twice, or spelt as a field is not, or
folding like an earlier one); anything else parses or fails exactly as json.loads does; and
load_json keeps its own limits."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nomyo_router.api import body_keys
from nomyo_router.api.errors import ApiError
from nomyo_router.api.requests import load_json

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
KEYS = st.sampled_from(
    [
        "model",
        "Model",
        "MODEL",
        "stream",
        "\u017ftream",
        "keep_alive",
        "\u212aeep_alive",
        "messages",
        "name",
        "x",
        "X",
        "é",
        "É",
    ]
) | st.text(max_size=6)


ESCAPE = st.booleans()  # (strategies made once: a new one per draw is validated each time)
WHITESPACE = st.sampled_from(["", " ", "\n", " \t", "\r\n  "])
ASCII_ONLY = st.booleans()


def escaped(key: str, draw: Any) -> str:
    """`key` as JSON text, each character written plainly or as \\uXXXX at random."""
    out = []
    for ch in key:
        plain = json.dumps(ch, ensure_ascii=False)[1:-1]
        out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 and draw(ESCAPE) else plain)
    return '"' + "".join(out) + '"'


@st.composite
def bodies(draw: Any) -> tuple[str, list[str]]:
    """A JSON object's text with random keys (repeats and case variants likely), random
    escaping of the keys, random whitespace; and its keys in order."""
    keys = draw(st.lists(KEYS, max_size=5))
    ws = WHITESPACE
    members = []
    for key in keys:
        value = json.dumps(draw(JSON_VALUES), ensure_ascii=draw(ASCII_ONLY))
        members.append(escaped(key, draw) + draw(ws) + ":" + draw(ws) + value)
    return draw(ws) + "{" + draw(ws) + ("," + draw(ws)).join(members) + draw(ws) + "}" + draw(ws), keys


def expected_refusal(keys: list[str]) -> str | None:
    """The key the check must name (the first given twice; else the first spelt as a field
    is not, or folding like an earlier one), or None when the body is acceptable."""
    if len(set(keys)) != len(keys):
        return next(k for i, k in enumerate(keys) if k in keys[:i])
    fields = {f.casefold(): f for f in body_keys.FIELDS}
    folded: set[str] = set()
    for key in keys:
        if fields.get(key.casefold(), key) != key or key.casefold() in folded:
            return key
        folded.add(key.casefold())
    return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
def test_objects_parse_as_json_loads_or_are_refused_naming_the_key(case):
    text, keys = case
    raw = text.encode()
    want = expected_refusal(keys)
    if want is None:
        assert body_keys.loads(raw) == json.loads(raw)
        return
    with pytest.raises(ApiError) as e:
        body_keys.loads(raw)
    assert e.value.status == 400 and e.value.param == want
    assert json.dumps(want, ensure_ascii=False) in e.value.message


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=40),
        st.text(alphabet=string.printable, max_size=40).map(str.encode),
        JSON_VALUES.map(lambda v: json.dumps(v).encode()),
        JSON_VALUES.map(lambda v: json.dumps(v).encode()).map(lambda b: b[: len(b) // 2]),
    )
)
def test_anything_else_parses_or_fails_exactly_as_json_loads(raw):
    try:
        want: Any = json.loads(raw)
    except (ValueError, RecursionError) as e:
        with pytest.raises(type(e)) as got:
            body_keys.loads(raw)
        assert str(got.value) == str(e)
        return
    if isinstance(want, dict):  # refused exactly when its keys, in order and as given, call for it
        refused = expected_refusal([key for key, _ in json.loads(raw, object_pairs_hook=list)])
        if refused is not None:
            with pytest.raises(ApiError) as e:
                body_keys.loads(raw)
            assert e.value.status == 400 and e.value.param == refused
            return
    # compared as JSON text: NaN equals nothing, not even itself (and 1 == 1.0 == True)
    assert json.dumps(body_keys.loads(raw)) == json.dumps(want)


def test_load_json_keeps_its_limits():
    with pytest.raises(ApiError, match="nested deeper"):
        load_json(b'{"a": ' + b"[" * 100 + b"]" * 100 + b"}")
    with pytest.raises(ApiError, match="lone surrogate"):
        load_json(b'{"model": "x", "prompt": "\\ud800"}')
    with pytest.raises(ApiError, match="invalid JSON"):
        load_json(b'{"model": "x",}')
    assert load_json(b'\xef\xbb\xbf{"model": "x"}') == {"model": "x"}  # (json.loads reads a UTF-8 BOM too)
    assert load_json('{"model": "x"}'.encode("utf-16")) == {"model": "x"}
    with pytest.raises(ApiError, match='"model"'):
        load_json('{"model": "x", "model": "y"}'.encode("utf-16"))
