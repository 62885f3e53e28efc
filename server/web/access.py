"""Who may read the pages: the API's rule, with a cookie a browser can carry.

Without an API token the service answers loopback clients only (server.limits.LoopbackOnly) and the pages
are open to them, as the API is. With a token, a page needs it: from the login form, which sets an HttpOnly,
SameSite=Strict cookie, or as the API's bearer header. The cookie holds a session value derived from the token
(an HMAC of it under a key kept in the data folder), never the token itself: a stolen cookie does not give the
token, and a new token (or a deleted key) ends every session. The cookie opens the pages and their polled JSON
only, never the /v1 API: a page can read the history, nothing a browser sends can change it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from urllib.parse import quote

from fastapi import Request
from pydantic import SecretStr

from kernelloop.server.routes.deps import get_service

COOKIE = "kernelloop_token"
COOKIE_MAX_AGE_S = 7 * 24 * 3600
SESSION_KEY_FILE = "session.key"
"""in the data folder, which the sandbox hides from submitted code"""


class LoginRequired(Exception):
    """The page needs the token: the handler sends the browser to the login form, then back."""

    def __init__(self, next_path: str):
        self.next_path = next_path


def token_of(request: Request) -> SecretStr | None:
    return get_service(request).settings.api_token


def require_reader(request: Request) -> None:
    """A dependency of every page (and of /docs): passes, or raises LoginRequired."""
    if not may_read(request):
        raise LoginRequired(request.url.path + (f"?{request.url.query}" if request.url.query else ""))


def may_read(request: Request) -> bool:
    """The service has no token, or the request carries it: the login cookie or the API's bearer header."""
    token = token_of(request)
    if token is None:
        return True
    bearer = _bearer(request)
    return logged_in(request) or (bearer is not None and matches(token, bearer))


def logged_in(request: Request) -> bool:
    """The browser holds the session cookie the login set: only then is there a session to log out of."""
    token, offered = token_of(request), request.cookies.get(COOKIE)
    return (
        token is not None
        and offered is not None
        and secrets.compare_digest(offered.encode(), session_value(request).encode())
    )


def session_value(request: Request) -> str:
    """The login cookie's value: an HMAC of the API token under this install's session key."""
    token = token_of(request)
    assert token is not None, "a session exists only where the service has a token"
    key = session_key(get_service(request).settings.data_dir)
    return hmac.new(key, token.get_secret_value().encode(), hashlib.sha256).hexdigest()


def session_key(data_dir: Path) -> bytes:
    """The install's session key, made whole on first use (32 random bytes, readable by the service's user only;
    linked into place, so a second process reads the first one's key, never half of it)."""
    path = data_dir / SESSION_KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        draft = data_dir / f"{SESSION_KEY_FILE}.{secrets.token_hex(8)}"
        descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(secrets.token_bytes(32))
        try:
            os.link(draft, path)
        except FileExistsError:
            pass  # another process made it first: its key is the one
        finally:
            draft.unlink()
    return path.read_bytes()


def matches(token: SecretStr, offered: str) -> bool:
    return secrets.compare_digest(offered.encode(), token.get_secret_value().encode())


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value if scheme.lower() == "bearer" and value else None


def safe_next(path: str | None) -> str:
    """Where to go after logging in: a path of this site only (never //host or a scheme: no open redirect)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


def login_url(next_path: str) -> str:
    return f"/login?next={quote(safe_next(next_path), safe='/')}"
