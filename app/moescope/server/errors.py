"""OpenAI-style error bodies: every failure a client can cause is one of these.

Clients (the ``openai`` library, Open WebUI, Continue) read ``error.message`` and the
HTTP status; a traceback or an HTML page would reach the user as noise. So a request
that goes wrong raises :class:`ApiError` and the app turns it into
``{"error": {"message", "type", "param", "code"}}`` with the status it names.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A request the server refuses, with the HTTP status and the OpenAI error fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_param(param: str, message: str, code: str | None = None) -> ApiError:
    """400 for one request field: ``param`` names it, as OpenAI's errors do."""
    return ApiError(400, message, param=param, code=code)


def too_long(param: str, message: str) -> ApiError:
    """413 for a prompt the context cannot hold: the request is too large for this
    model, not malformed. The body keeps OpenAI's code, ``context_length_exceeded``, so
    a client that checks the code (trimming history and retrying) still recognises it."""
    return ApiError(413, message, param=param, code="context_length_exceeded")


def busy(retry_after_s: int, message: str) -> ApiError:
    """503 with Retry-After: the queue is full, the client should come back."""
    return ApiError(503, message, type="server_error", code="server_busy",
                    headers={"Retry-After": str(retry_after_s)})
