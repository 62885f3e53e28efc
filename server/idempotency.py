"""The Idempotency-Key header of the tool calls: a client that retries after a dropped connection, with the same
key and the same request, gets the job its first call queued instead of a second one.

A key is the client's own string (a UUID, say: 1-255 visible ASCII characters). Keys are scoped: to the bearer
token a call carries (a digest of it, never the token), else to the client's address, so two clients never
share a key by chance. The same key with another request (another tool, another body) is a 422 naming the job
it was first used for. Keys live in the database, so a retry after a restart of the service still finds its
job; the job is answered as it stands (waited for as any call's, `wait` and `timeout_s` apply), with the
header `Idempotent-Replayed: true`.
"""

from __future__ import annotations

import hashlib
import re

from fastapi.security import HTTPAuthorizationCredentials
from sqlmodel import Session

from kernelloop.contract import JobPublic, SubmissionRequest
from kernelloop.server.errors import ApiError
from kernelloop.server.service import Service
from kernelloop.storage import idempotency
from kernelloop.tools.phase_registry import JobPhase

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_CHARS = 255
_KEY = re.compile(r"[\x21-\x7e]+")
FIELD = f"header.{HEADER}"


def scope_of(credentials: HTTPAuthorizationCredentials | None, client: str) -> str:
    """Whose key it is: the token the call carries (its digest), else the client's address."""
    if credentials is not None:
        return "token:" + hashlib.sha256(credentials.credentials.encode()).hexdigest()[:32]
    return f"client:{client}"[:200]


def check_key(key: str) -> None:
    if not 1 <= len(key) <= MAX_KEY_CHARS or not _KEY.fullmatch(key):
        raise ApiError(
            422,
            "invalid_idempotency_key",
            f"{HEADER} must be 1 to {MAX_KEY_CHARS} visible ASCII characters without spaces (got {len(key)} "
            "characters)",
            field=FIELD,
            fix="send a fresh random key per request, e.g. a UUID, and the same key when retrying that request",
        )


def submit_once(
    service: Service, phase: JobPhase, body: SubmissionRequest, client: str, scope: str, key: str
) -> tuple[JobPublic, bool]:
    """The job this key's first call queued (True: replayed), or a new job queued under the key (False)."""
    check_key(key)
    call = idempotency.CallKey(scope=scope, key=key, request_sha256=idempotency.request_digest(phase, body))
    first = _first_job(service, call)
    if first is not None:
        return first, True
    try:
        return service.submit(phase, body, client, once=call), False
    except idempotency.KeyTaken:  # a concurrent retry queued it first: that job is this call's too
        first = _first_job(service, call)
        if first is None:
            raise
        return first, True


def _first_job(service: Service, call: idempotency.CallKey) -> JobPublic | None:
    with Session(service.engine) as session:
        row = idempotency.find(session, call.scope, call.key)
    if row is None:
        return None
    if row.request_sha256 != call.request_sha256:
        raise ApiError(
            422,
            "idempotency_key_reused",
            f"{HEADER} {call.key!r} was first used for another request (job {row.job_id}): another tool or body",
            field=FIELD,
            fix=f"send a new key for a new request; to get job {row.job_id} back, repeat its request exactly "
            f"(or GET /v1/jobs/{row.job_id})",
        )
    return service.job(row.job_id)
