"""Schemathesis hooks for tests/server/test_server_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

Generated bodies are also sent with hostile JSON in their fields: nesting up to two hundred levels
deep, and text from the corners of Unicode (NUL, unpaired surrogates, right-to-left marks, combining marks,
astral planes). The service may refuse those (they break its stated limits), but never with a 5xx or a
dropped connection, and every 4xx it sends names what was wrong and the fix (`errors_name_the_field`).
"""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import strategies as st

HOSTILE_TEXT = st.one_of(
    st.sampled_from(["\x00", "a\x00b", "\u202eevil", "e\u0301\u0301\u0301", "\U0001f600" * 50, "\ufeff", ""]),
    st.text(st.characters(codec="utf-8"), max_size=50),
    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3),  # lone surrogates
)
MUTATED: set[int] = set()  # the ids of bodies this hook made: refusing them is no schema violation


def _deep(depth: int, leaf: Any) -> Any:
    node = leaf
    for level in range(depth):
        node = [node] if level % 2 else {"k": node}
    return node


HOSTILE_VALUE = st.one_of(
    st.builds(_deep, st.integers(min_value=30, max_value=200), HOSTILE_TEXT),  # deeper: tests/server/test_server_api.py
    HOSTILE_TEXT,
    st.integers(min_value=10**40, max_value=10**60),
)


def _mutated(body: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    changed = {**body, key: value}
    MUTATED.add(id(changed))
    return changed


@schemathesis.hook
def flatmap_body(context: Any, body: Any) -> st.SearchStrategy[Any]:
    if not isinstance(body, dict) or not body:
        return st.just(body)
    return st.one_of(
        st.just(body),
        st.builds(_mutated, st.just(body), st.sampled_from(sorted(body)), HOSTILE_VALUE),
    )


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure, except 'a schema-valid request was refused' for a body made hostile here."""
    refused_hostile = id(case.body) in MUTATED and "rejected" in str(getattr(failure, "title", "")).lower()
    return not refused_hostile


@schemathesis.check
def errors_name_the_field(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx is the service's error body: what went wrong, where (when a field is to blame) and the fix."""
    if not 400 <= response.status_code < 500:
        return None
    body = response.json()
    for key in ("error", "message", "fix"):
        if not isinstance(body.get(key), str) or not body[key]:
            raise AssertionError(f"a {response.status_code} without its {key!r}: {str(body)[:300]}")
    return None
