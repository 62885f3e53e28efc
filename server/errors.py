"""Every error a client can cause becomes a 4xx with an ErrorBody that names the field and the fix.

Routes and the service raise `ApiError`; pydantic's validation errors and Starlette's own (404 on an
unknown route, 405) are rewritten into the same shape. A 500 means a bug in the service: it is logged
with its traceback and answered without internals.
"""

from __future__ import annotations

import logging
import re
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlmodel import Session, SQLModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from kernelloop.contract import ErrorBody, FieldError

log = logging.getLogger("kernelloop.server")


Row = TypeVar("Row", bound=SQLModel)


class ApiError(Exception):
    def __init__(
        self,
        status_code: int,
        error: str,
        message: str,
        *,
        field: str | None = None,
        fix: str = "",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status_code, self.headers = status_code, headers
        self.body = ErrorBody(error=error, message=message, field=field, fix=fix)


def row_or_unknown(session: Session, table: type[Row], row_id: int, *, field: str, fix: str) -> Row:
    """The row of `table` with this id, or the ApiError that says there is none (`unknown_job`, `no job 7`): 422 for
    an id in the body, 404 for one in the path or a tool's arguments."""
    row = session.get(table, row_id)
    if row is None:
        what = table.__name__.lower()
        status_code = 422 if field.startswith("body") else 404
        raise ApiError(status_code, f"unknown_{what}", f"no {what} {row_id}", field=field, fix=fix)
    return row


def within_size_limit(text: str, field: str, limit: int, error: str, smaller: str) -> None:
    """A body field over its size limit is refused (413); the fix names the setting, whose variable is
    KERNELLOOP_ and the error's noun: KERNELLOOP_MAX_CODE_BYTES for code_too_large."""
    size = len(text.encode())
    if size > limit:
        variable = f"KERNELLOOP_MAX_{error.removesuffix('_too_large').upper()}_BYTES"
        raise ApiError(
            413,
            error,
            f"{field.removeprefix('body.')} is {size} bytes, over the limit of {limit}",
            field=field,
            fix=f"send a smaller {smaller} ({variable} sets the limit)",
        )


def error_response(status_code: int, body: ErrorBody, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status_code, content=body.model_dump(mode="json"), headers=headers)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(part) for part in loc)


FIXES = {
    "missing": "add the field",
    "string_too_short": "send a non-empty string",
    "string_too_long": "send a shorter string: the message gives the limit",
    "literal_error": "use one of the values the message lists",
    "enum": "use one of the values the message lists",
    "int_parsing": "send an integer",
    "float_parsing": "send a number",
    "bool_parsing": "send true or false",
    "extra_forbidden": "remove the field; GET /openapi.json lists the accepted ones",
    "model_attributes_type": "send a JSON object",
    "dict_type": "send a JSON object",
    "string_type": "send a string",
    "value_error": "see the message",
}


def _validation_response(exc: RequestValidationError) -> JSONResponse:
    raw = list(exc.errors())
    bad_json = next((e for e in raw if e.get("type") == "json_invalid"), None)
    if bad_json is not None:
        detail = (bad_json.get("ctx") or {}).get("error", "")
        where = f" at character {bad_json['loc'][1]}" if len(bad_json.get("loc", ())) > 1 else ""
        return error_response(
            400,
            ErrorBody(
                error="malformed_json",
                message=f"the body is not valid JSON{where}: {detail}".rstrip(": "),
                field="body",
                fix="send one JSON object with the header Content-Type: application/json",
            ),
        )
    errors = [
        FieldError(field=_field(e.get("loc", ())), message=str(e.get("msg", "")), type=str(e.get("type", "")))
        for e in raw
    ]
    first = errors[0] if errors else FieldError(field="body", message="invalid request")
    if first.field == "body" and first.type == "missing":
        return error_response(
            422,
            ErrorBody(
                error="invalid_request",
                message="the request has no body",
                field="body",
                errors=errors,
                fix="send a JSON object with Content-Type: application/json (GET /openapi.json has its schema)",
            ),
        )
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    own_fix = (raw[0].get("ctx") or {}).get("fix") if raw else None  # a validator's own (e.g. the name to send)
    return error_response(
        422,
        ErrorBody(
            error="invalid_request",
            message=f"{first.field}: {first.message}{more}",
            field=first.field,
            fix=str(own_fix or FIXES.get(first.type, "correct the field; GET /openapi.json has the schema")),
            errors=errors,
        ),
    )


def _allowed_methods(request: Request, fallback: str) -> list[str]:
    """Every method the API documents for this path (Starlette's own 405 names only the first route's)."""
    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, request.url.path):
            methods |= {method.upper() for method in operations}
    return sorted(methods) or [m.strip() for m in fallback.split(",") if m.strip()]


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status_code, exc.body, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            body = ErrorBody(
                error="not_found",
                message=f"no such endpoint: {request.method} {request.url.path}",
                fix="GET /docs or /openapi.json lists the endpoints",
            )
        elif exc.status_code == 405:
            allowed = _allowed_methods(request, (getattr(exc, "headers", None) or {}).get("Allow", ""))
            body = ErrorBody(
                error="method_not_allowed",
                message=f"{request.method} is not allowed on {request.url.path}",
                fix=f"use {', '.join(allowed)} on this path (see /openapi.json)",
            )
            return error_response(405, body, {"Allow": ", ".join(allowed)})
        else:
            body = ErrorBody(error="http_error", message=str(exc.detail))
        return error_response(exc.status_code, body, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(
            500,
            ErrorBody(
                error="internal_error",
                message=f"the service failed: {type(exc).__name__}",
                fix="this is a kernelloop bug; the service log has the traceback",
            ),
        )
