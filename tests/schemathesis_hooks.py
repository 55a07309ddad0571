"""Schemathesis hooks for ``tests/daemon/test_schemathesis.py`` (loaded through ``SCHEMATHESIS_HOOKS``).

Every check runs (``--checks all``). One kind of finding is dropped, and only in the exact form
listed in :data:`STATE_DEPENDENT`: a schema-valid request refused with a 400 whose reason is
state the schema cannot describe. Each entry names the code and the start of its ``error``
text; any other 400 of a schema-valid request, or one of these codes with another text (say, a
relative ``cwd`` or both transcript cursors, which the schema does describe), still fails.
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis

#: code -> (start of the error text, why the schema cannot rule it out)
STATE_DEPENDENT: dict[str, tuple[str, str]] = {
    "invalid_cwd": ("Invalid workspace directory:",
                    "an absolute path is schema-valid; whether that directory exists is not"),
    "invalid_client_id": ("Client ",
                          "a well-formed client id is valid; whether the session registered "
                          "it (create/load did) is state"),
    "invalid_transcript_cursor": ("Unknown transcript cursor or record id",
                                  "cursors and record ids are made by the daemon; a well-formed "
                                  "one it never made names nothing"),
    "invalid_sessions_cursor": ("cursor is not a nextCursor of GET /sessions",
                                "a session list's cursors are made by the daemon; any other "
                                "string is schema-valid and names no place in the list"),
}


def state_dependent_refusal(status: int, body: bytes) -> str | None:
    """The code of a 400 listed in :data:`STATE_DEPENDENT`, else None."""
    if status != 400:
        return None
    try:
        payload: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    code, error = payload.get("code"), payload.get("error")
    rule = STATE_DEPENDENT.get(code) if isinstance(code, str) else None
    if rule is None or not isinstance(error, str) or not error.startswith(rule[0]):
        return None
    if code == "invalid_client_id" and not error.endswith("is not registered for this session"):
        return None
    return code


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure except a positive case refused for a state-dependent reason."""
    if getattr(failure, "code", None) != "ST202":  # "Schema-valid request rejected"
        return True
    return state_dependent_refusal(response.status_code, response.content) is None
