"""Secrets out of what a job sends back: the service's token, its database password, and any key-like
variable of its own environment are replaced before a result is stored or returned.

The sandbox keeps these out of a worker's reach; this is the second line, for an isolation that was asked
to be weaker, or a leak nobody foresaw. A result is redacted as JSON text, so no field is missed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable

from pydantic import TypeAdapter
from sqlalchemy.engine import make_url

from kernelloop.tools.results import PhaseResult, PhaseResultAny

REDACTED = "[redacted]"
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
MIN_SECRET_CHARS = 8  # shorter values would blank out ordinary words
RESULT_ADAPTER: TypeAdapter[PhaseResult] = TypeAdapter(PhaseResultAny)


def service_secrets(api_token: str | None, database_url: str, environ: dict[str, str] | None = None) -> list[str]:
    """The strings a result must never carry: the token, the database password, key-like variables."""
    environ = dict(os.environ) if environ is None else environ
    found = [api_token or ""]
    try:
        found.append(make_url(database_url).password or "")
    except Exception:  # not a URL SQLAlchemy reads: it carries no password we could find either
        pass
    found += [value for name, value in environ.items() if SECRET_NAME.search(name)]
    return sorted({s for s in found if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)


class Redactor:
    def __init__(self, secrets: Iterable[str]):
        self.secrets = list(secrets)

    def __call__(self, result: PhaseResult) -> PhaseResult:
        if not self.secrets:
            return result
        text = result.model_dump_json()
        clean = text
        for secret in self.secrets:
            clean = clean.replace(json.dumps(secret)[1:-1], REDACTED)  # as it appears inside a JSON string
        return result if clean == text else RESULT_ADAPTER.validate_json(clean)
