"""Who may read the pages: the API's rule, with a cookie a browser can carry.

Without an API token the service answers loopback clients only (server.limits.LoopbackOnly) and the pages
are open to them, as the API is. With a token, a page needs it: from the login form, which keeps it in an
HttpOnly, SameSite=Strict cookie, or as the API's bearer header. The cookie opens the pages and their
polled JSON only, never the /v1 API: a page can read the history, nothing a browser sends can change it.
"""

from __future__ import annotations

import secrets
from urllib.parse import quote

from fastapi import Request
from pydantic import SecretStr

from kernelloop.server.routes.deps import get_service

COOKIE = "kernelloop_token"
COOKIE_MAX_AGE_S = 7 * 24 * 3600


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
    offered = request.cookies.get(COOKIE) or _bearer(request)
    return offered is not None and matches(token, offered)


def logged_in(request: Request) -> bool:
    """The browser holds the login cookie with the token: only then is there a session to log out of."""
    token, offered = token_of(request), request.cookies.get(COOKIE)
    return token is not None and offered is not None and matches(token, offered)


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
