"""Request limits: body size, a per-client rate limit on state-changing calls, no encoded slash in a path, and
loopback-only access while no API token is set."""

from __future__ import annotations

import ipaddress
import json
import math
import re
import threading
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernelloop.contract import ErrorBody
from kernelloop.server.errors import error_response

MUTATING_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host in ("localhost", "testclient"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BodySizeLimit:
    """Answers 413 for a body over `max_bytes`, whether or not it declares its length (chunked), and 422 for text
    no column can hold; not on `own_text_checks`, paths whose protocol refuses such text itself, by the argument
    it is in (the MCP endpoint answers JSON-RPC, which an HTTP 422 is not)."""

    def __init__(self, app: ASGIApp, max_bytes: int, own_text_checks: frozenset[str] = frozenset()):
        self.app, self.max_bytes, self.own_text_checks = app, max_bytes, own_text_checks

    def _too_large(self) -> ErrorBody:
        return ErrorBody(
            error="body_too_large",
            message=f"the request body is over {self.max_bytes} bytes",
            field="body",
            fix=f"send at most {self.max_bytes} bytes (code: at most KERNELLOOP_MAX_CODE_BYTES)",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING_METHODS:
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(413, self._too_large())(scope, receive, send)
            return
        # read the body here (bounded), then hand it on unchanged
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await error_response(413, self._too_large())(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, delivered = b"".join(chunks), False
        content_type = dict(scope.get("headers") or []).get(b"content-type", b"").decode("latin-1")
        unreadable = _encoding_problem(body, content_type) or _number_problem(body)
        if unreadable is not None:  # a parse error, named: 400 like malformed JSON
            await error_response(400, unreadable)(scope, receive, send)
            return
        problem = _text_problem(body) if scope["path"] not in self.own_text_checks else None
        if problem is not None:
            await error_response(422, problem)(scope, receive, send)
            return

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""An escaped UTF-16 surrogate, high (D800-DBFF) or low (DC00-DFFF): valid only as a pair."""


def _not_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _find_lone_surrogate(node: Any, where: str) -> str | None:
    """Where the first string or key that is not valid Unicode (a lone surrogate) is, as a field name."""
    if isinstance(node, str):
        return where if _not_unicode(node) else None
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in children:
        if isinstance(key, str) and _not_unicode(key):
            return f"{where} (one of its keys)"
        found = _find_lone_surrogate(value, f"{where}.{key}")
        if found is not None:
            return found
    return None


MAX_BODY_DEPTH = 64
"""Deepest nesting of arrays and objects a request body may have; the stored fields allow less."""


def json_depth(body: bytes) -> int:
    """How deeply the arrays and objects of a JSON text nest, by one scan of its bytes (strings skipped),
    so a body too deep to parse safely is refused before any recursive parser sees it."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _text_problem(body: bytes) -> ErrorBody | None:
    """Text no database column can hold (a NUL character, half of a UTF-16 surrogate pair), or a body
    nested too deeply to parse."""
    depth = json_depth(body)
    if depth > MAX_BODY_DEPTH:
        return ErrorBody(
            error="too_deep",
            message=f"the body nests arrays and objects {depth} levels deep, over the limit of {MAX_BODY_DEPTH}",
            field="body",
            fix="send flatter JSON: no field of this API needs more than a few levels",
        )
    if b"\\u0000" in body or b"\x00" in body:
        return ErrorBody(
            error="invalid_text",
            message="the body contains a NUL character (\\u0000)",
            field="body",
            fix="remove NUL characters: no field accepts them",
        )
    if SURROGATE_ESCAPE.search(body):
        try:
            where = _find_lone_surrogate(json.loads(body), "body")
        except (ValueError, RecursionError):
            return None  # not JSON: the endpoint's own parsing says so
        if where is not None:
            return ErrorBody(
                error="invalid_text",
                message=f"{where} contains an unpaired UTF-16 surrogate (\\udXXX), which is not Unicode text",
                field=where,
                fix="send valid Unicode text: a surrogate only as half of a pair (\\ud83d\\ude00)",
            )
    return None


CHARSET = re.compile(r"charset\s*=\s*\"?([^\s;\"]+)", re.IGNORECASE)


def _encoding_problem(body: bytes, content_type: str) -> ErrorBody | None:
    """A body that is not UTF-8, or says it is in another charset: JSON is UTF-8 (RFC 8259)."""
    declared = CHARSET.search(content_type)
    if declared and declared.group(1).lower().replace("_", "-") not in ("utf-8", "utf8"):
        return ErrorBody(
            error="unsupported_charset",
            message=f"the body is declared as {declared.group(1)}; this API reads JSON as UTF-8 only",
            field="header.content-type",
            fix="encode the body as UTF-8 and send Content-Type: application/json (no charset, or charset=utf-8)",
        )
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ErrorBody(
            error="invalid_encoding",
            message=f"the body is not UTF-8: byte {exc.start} is 0x{body[exc.start]:02x}",
            field="body",
            fix="encode the body as UTF-8 (JSON's only encoding); escape other characters as \\uXXXX if need be",
        )
    return None


MAX_INTEGER_DIGITS = 4300  # what Python's int() takes from text by default (sys.int_info.default_max_str_digits)


class _LongInteger:
    def __init__(self, digits: str):
        self.digits = digits


def _number_problem(body: bytes) -> ErrorBody | None:
    """An integer literal too long to read, named by where it is in the body."""
    if not re.search(rb"\d{%d}" % (MAX_INTEGER_DIGITS + 1), body):
        return None
    try:
        parsed = json.loads(body, parse_int=lambda s: int(s) if len(s) <= MAX_INTEGER_DIGITS else _LongInteger(s))
    except (ValueError, RecursionError):
        return None  # not JSON: the endpoint's own parsing says so
    found = _find_long_integer(parsed, "body")
    if found is None:
        return None
    where, number = found
    return ErrorBody(
        error="number_too_long",
        message=f"{where} is an integer of {len(number.digits.lstrip('-'))} digits, over {MAX_INTEGER_DIGITS}",
        field=where,
        fix="send a number of sensible size; ids and counts of this API fit in 64 bits",
    )


def _find_long_integer(node: Any, where: str) -> tuple[str, _LongInteger] | None:
    if isinstance(node, _LongInteger):
        return where, node
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in children:
        found = _find_long_integer(value, f"{where}.{key}")
        if found is not None:
            return found
    return None


ENCODED_SLASH = b"%2f"
"""decoded before routing, it would make one segment two: `causal_conv1d%2Fleaderboard` a problem's leaderboard"""


class NoEncodedSlash:
    """A path holding an encoded slash (%2F) is a 400 on every path, a route's or none's: decoded, it would be
    routed as two segments (another route's answer, a 404 naming the decoded path, a redirect to a route)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_path: bytes = (scope.get("raw_path") or b"") if scope["type"] == "http" else b""
        if ENCODED_SLASH in raw_path.lower():
            problem = ErrorBody(
                error="encoded_slash",
                message=f"the path {raw_path.decode('latin-1')[:300]!r} holds an encoded slash (%2F)",
                field="path",
                fix="no name holds a slash: send the names the API lists, with plain slashes between the segments",
            )
            await error_response(400, problem)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class LoopbackOnly:
    """Without an API token nothing guards state-changing calls, so only this host may call at all."""

    def __init__(self, app: ASGIApp, enabled: bool):
        self.app, self.enabled = app, enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.enabled and scope["type"] == "http" and not is_loopback((scope.get("client") or (None,))[0]):
            await error_response(
                403,
                ErrorBody(
                    error="loopback_only",
                    message="this service has no API token, so it answers this host only",
                    fix="set KERNELLOOP_API_TOKEN on the service and send Authorization: Bearer <token>",
                ),
            )(scope, receive, send)
            return
        await self.app(scope, receive, send)


class RateLimiter:
    """A token bucket per client: `per_minute` calls, refilled continuously. Thread-safe."""

    def __init__(self, per_minute: int):
        self.per_minute = per_minute
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def acquire(self, client: str) -> float | None:
        """None if the call may go ahead, else the seconds until it may."""
        if self.per_minute <= 0:
            return None
        rate = self.per_minute / 60.0
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(client, (float(self.per_minute), now))
            tokens = min(float(self.per_minute), tokens + (now - last) * rate)
            if tokens < 1.0:
                self._buckets[client] = (tokens, now)
                return math.ceil((1.0 - tokens) / rate)
            self._buckets[client] = (tokens - 1.0, now)
            if len(self._buckets) > 10_000:  # forget clients whose bucket is full again
                full = [k for k, (t, at) in self._buckets.items() if t + (now - at) * rate >= self.per_minute]
                for key in full:
                    del self._buckets[key]
            return None
