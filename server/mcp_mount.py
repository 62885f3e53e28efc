"""The MCP tools mounted on the service at /mcp (streamable HTTP), behind the API's own token.

The tools call the API in-process (httpx's ASGI transport into this same app) with the service's token, so an
MCP call passes the same validation, limits and recording as an HTTP call. Without a token the service answers
loopback clients only (as the API does), and the MCP endpoint also checks the Host header against loopback
names, so a web page that rebinds a DNS name to 127.0.0.1 cannot reach it.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import SecretStr
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from kernelloop.agent.service_client import ServiceClient
from kernelloop.contract import ErrorBody
from kernelloop.server.mcp_tools import build_mcp_server

MCP_PATH = "/mcp"
LOOPBACK_ONLY = TransportSecuritySettings(
    allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
    allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
)


def mount_mcp(app: FastAPI, token: SecretStr | None) -> MCPServer:
    """Add the /mcp route to `app`; run `server.session_manager.run()` for as long as the app serves."""
    secret = token.get_secret_value() if token else None

    @asynccontextmanager
    async def in_process() -> AsyncIterator[ServiceClient]:
        transport = httpx.ASGITransport(app=app)
        async with ServiceClient("http://kernelloop.in-process", token=secret, transport=transport) as client:
            yield client

    server = build_mcp_server(in_process)
    server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        transport_security=LOOPBACK_ONLY
        if secret is None
        else TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    endpoint = _RequireToken(StreamableHTTPASGIApp(server.session_manager), secret)
    app.router.routes.append(Route(MCP_PATH, endpoint=endpoint, methods=["GET", "POST", "DELETE"]))
    return server


class _RequireToken:
    """An ASGI app (a class, so Starlette's Route hands it the raw request) that answers 401 without the token."""

    def __init__(self, inner: ASGIApp, secret: str | None):
        self.inner, self.secret = inner, secret

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.secret is not None and scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            sent = headers.get(b"authorization", b"").removeprefix(b"Bearer ")
            if not secrets.compare_digest(sent, self.secret.encode()):
                body = ErrorBody(
                    error="unauthorized",
                    message="the MCP endpoint requires the service's API token",
                    field="header.Authorization",
                    fix="send the header Authorization: Bearer <KERNELLOOP_API_TOKEN> (the MCP client's headers)",
                )
                response = JSONResponse(body.model_dump(mode="json"), 401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.inner(scope, receive, send)
