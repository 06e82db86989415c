"""What every route shares: the request body read within its byte budget and parsed into its
schema (protocol.py), and the HTTP answer to any exception.
Part of `transmuter serve`: `pip install transmuter[serve]`.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request

from transmuter.errors import InputError, Overloaded, ServingClosed
from transmuter.serving.protocol import ApiError, parse

__all__ = ["ApiError", "BodyLimit", "error_for", "read_body"]

_log = logging.getLogger("transmuter.serving")


async def read_body(request: Request, model: type) -> Any:
    """The body as a `model` (protocol.py), or an ApiError naming what is wrong."""
    return parse(model, await request.body())


def error_for(error: BaseException) -> ApiError:
    """The answer to an exception raised while serving a request: the request's fault (an
    InputError) is a 400, a refusal for load a 503 with Retry-After, anything else the
    server's or the model's fault, a 500 that names the exception."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, Overloaded):
        return ApiError(503, str(error), code="overloaded", headers={"Retry-After": "1"})
    if isinstance(error, ServingClosed):
        return ApiError(503, str(error), code="shutting_down", headers={"Retry-After": "5"})
    if isinstance(error, InputError):
        return ApiError(400, str(error))
    if isinstance(error, MemoryError):
        return ApiError(500, f"out of memory: {error}", code="out_of_memory")
    _log.error("a request failed", exc_info=error)
    return ApiError(500, f"{type(error).__name__}: {error}", code="internal_error")


class BodyLimit:
    """ASGI middleware: a request body past `limit` bytes fails with a 413 as it is read (its
    Content-Length, where given, is checked before a byte of it is), so a large body is never
    held whole in memory. The route's handler turns the raised ApiError into its answer."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, seen = self.limit, 0
        declared = dict(scope.get("headers") or ()).get(b"content-length")

        def too_large(size: str) -> ApiError:
            return ApiError(413, f"the body has {size} bytes; this server takes at most {limit} "
                            "(--max-request-bytes)", code="payload_too_large")  # fmt: skip

        async def limited() -> dict:
            nonlocal seen
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise too_large(declared.decode())
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise too_large(f"more than {limit}")
            return message

        await self.app(scope, limited, send)
