"""What every route shares: OpenAI's error shape and the checks of a JSON body's fields."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse


class ApiError(Exception):
    """A request the server refuses: its HTTP status and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        fields = {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}
        return {"error": fields}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), self.status, headers=self.headers)


async def json_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body())
    except ValueError as error:
        raise ApiError(400, f"the body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def flag(body: dict, field: str, default: bool) -> bool:
    value = body.get(field, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"'{field}' must be true or false", param=field)
    return value


def number(body: dict, field: str, default: Any, low: float, high: float, kind: type = float):
    """`field` as a `kind` within [low, high], or `default` where absent (or null)."""
    value = body.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise ApiError(400, f"'{field}' must be {'a number' if kind is float else 'an integer'}",
                       param=field)  # fmt: skip
    if not low <= value <= high:
        raise ApiError(400, f"'{field}' must be between {low} and {high}; got {value}",
                       param=field)  # fmt: skip
    return kind(value)
