"""The OpenAPI document as the service enforces it, so clients, code generators and fuzzers see the rules
that the code checks: no string of a request body may hold a NUL character (the body middleware refuses
one anywhere), and a `problem` in a request must name a registered problem. The document is built once;
the problem names are filled in on every request for it, since problems are registered while it runs. Since it
names them, GET /openapi.json needs the API token as the reads do (the bearer header, or the login cookie of a
browser reading it for /docs).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse

from kernelloop.server.errors import ApiError
from kernelloop.server.web import access

NO_NUL = "^[^\\u0000]*$"
"""A string without a NUL character (ECMA-262 syntax, as JSON Schema patterns are)."""

REQUEST_MODELS_NAMING_A_PROBLEM = ("SubmissionRequest", "RunCreate")
OPENAPI_PATH = "/openapi.json"
"""served here, guarded (the app is made with openapi_url=None, so FastAPI serves no unguarded copy)"""


def install(app: FastAPI, problem_names: Callable[[], list[str]]) -> None:
    """Serve the document with the rules above declared; `problem_names` lists the registered problems."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            _declare_no_nul(document)
            _declare_encoded_slash(document)
            app.openapi_schema = document
        document = copy.deepcopy(app.openapi_schema)
        names = sorted(problem_names())
        schemas = document["components"]["schemas"]
        for model in REQUEST_MODELS_NAMING_A_PROBLEM:
            schemas[model]["properties"]["problem"]["enum"] = names
        return document

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get(OPENAPI_PATH, include_in_schema=False)
    async def document(request: Request) -> JSONResponse:
        if not access.may_read(request):
            raise ApiError(
                401,
                "unauthorized",
                f"GET {OPENAPI_PATH} reads the service's records (it names every registered problem) and the service "
                "requires its API token",
                field="header.Authorization",
                fix="send the header Authorization: Bearer <KERNELLOOP_API_TOKEN>, or log in at /login in a browser",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return JSONResponse(openapi())


def _request_models(document: dict[str, Any]) -> set[str]:
    """The component schemas request bodies use, and those they use in turn."""
    schemas = document["components"]["schemas"]
    found: set[str] = set()
    pending = [
        content["schema"]
        for path in document["paths"].values()
        for operation in path.values()
        for content in operation.get("requestBody", {}).get("content", {}).values()
    ]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
                name = ref.rsplit("/", 1)[1]
                if name not in found:
                    found.add(name)
                    pending.append(schemas[name])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return found


def _declare_encoded_slash(document: dict[str, Any]) -> None:
    """Every operation with a path parameter may answer 400: a parameter holding an encoded slash (%2F) is refused
    (server.routes.deps) rather than read as two segments."""
    for operations in document["paths"].values():
        for operation in operations.values():
            if any(p["in"] == "path" for p in operation.get("parameters", [])):
                operation["responses"].setdefault(
                    "400",
                    {
                        "description": "a path parameter holds an encoded slash (%2F)",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
                    },
                )


JSON_VALUE = "#/components/schemas/JsonValue"
JSON_VALUE_SCHEMA = {
    "description": "any JSON value without a NUL character in its strings or keys",
    "anyOf": [
        {"type": "string", "pattern": NO_NUL},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "array", "items": {"$ref": JSON_VALUE}},
        {"type": "object", "propertyNames": {"pattern": NO_NUL}, "additionalProperties": {"$ref": JSON_VALUE}},
    ],
}


def _declare_no_nul(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    for name in _request_models(document):
        _no_nul_in(schemas[name])
    schemas["JsonValue"] = JSON_VALUE_SCHEMA


def _no_nul_in(node: Any) -> None:
    """Add the pattern to every string schema inside `node` that has none, and to the strings and keys of
    free-form objects (a run's config and meta)."""
    if isinstance(node, dict):
        if node.get("type") == "string" and "pattern" not in node and "enum" not in node and "format" not in node:
            node["pattern"] = NO_NUL
        if node.get("type") == "object" and node.get("additionalProperties") is True:
            node["propertyNames"] = {"pattern": NO_NUL}
            node["additionalProperties"] = {"$ref": JSON_VALUE}
        for value in node.values():
            _no_nul_in(value)
    elif isinstance(node, list):
        for value in node:
            _no_nul_in(value)
