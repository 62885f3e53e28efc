"""The idempotency keys of tool calls, kept in the database so that a retry after a restart still finds its job.

A key belongs to a scope (whose key it is) and names one request: the tool and its body, as a digest of their
canonical JSON, so a retry that sends the same body with its fields in another order is the same request. The
row is written in the transaction that queues the job, so a key never exists without its job; two concurrent
calls with one key cannot both queue one: the second's insert breaks the unique index and it takes the
first's job instead.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel
from sqlmodel import Session, select

from kernelloop.contract import SubmissionRequest
from kernelloop.storage.models import IdempotencyKey
from kernelloop.tools.phase_registry import JobPhase


class KeyTaken(RuntimeError):
    """A concurrent call with the same key queued its job first: nothing was queued for this one."""


class CallKey(BaseModel):
    """A tool call's key, where it belongs, and the request it names."""

    scope: str
    key: str
    request_sha256: str


def request_digest(phase: JobPhase, body: SubmissionRequest) -> str:
    """The tool and its parsed body as canonical JSON, hashed: equal for equal requests however they were sent."""
    canonical = json.dumps({"tool": phase, "body": body.model_dump(mode="json")}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def find(session: Session, scope: str, key: str) -> IdempotencyKey | None:
    return session.exec(select(IdempotencyKey).where(IdempotencyKey.scope == scope, IdempotencyKey.key == key)).first()


def remember(session: Session, call: CallKey, job_id: int) -> None:
    """Add the key of the job being queued to this session (its transaction commits both)."""
    session.add(IdempotencyKey(scope=call.scope, key=call.key, request_sha256=call.request_sha256, job_id=job_id))
