"""The one HTTP error shape, ``{"error": {"message", "type", "param", "code"}}``, mapped at the edge.

Every Treadle FastAPI app calls ``install_error_handlers``; routes declare ``ERROR_RESPONSES`` so the
OpenAPI schema shows the shape. Tracebacks never reach clients: unknown exceptions become a 500
with a fixed message and are logged here.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import fastapi
import fastapi.exceptions
import starlette.exceptions
from fastapi import responses
from pydantic import BaseModel

from treadle import errors

log = logging.getLogger(__name__)


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


class PayloadTooLarge(errors.SpecError):
    """A request body above the app's limit; answered with 413 before the route runs."""


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in (
        (400, "bad input; `param` names the field"),
        (401, "no token, or not the job's (`Authorization: Bearer <token>`)"),
        (404, "unknown id"),
        (409, "valid, but the current state forbids it"),
        (413, "request body too large"),
        (429, "overloaded; retry after the `Retry-After` header's seconds"),
        (500, "internal error"),
        (503, "a dependency is down or draining; retry later"),
        (504, "the operation timed out"),
    )
}


def error(code: int, type_: str, message: str, *, param: str | None = None) -> responses.JSONResponse:
    body = ErrorResponse(error=ErrorInfo(message=message, type=type_, param=param, code=code))
    return responses.JSONResponse(body.model_dump(), status_code=code)


def to_response(exc: BaseException) -> responses.JSONResponse:
    """The response for any exception a route lets escape."""
    match exc:
        case PayloadTooLarge():
            return error(413, "PayloadTooLarge", str(exc), param=exc.field)
        case errors.SpecError():
            return error(400, "BadRequestError", str(exc), param=exc.field)
        case errors.NotFound():
            return error(404, "NotFoundError", str(exc) or "not found")
        case errors.Conflict():
            return error(409, "ConflictError", str(exc))
        case errors.Overloaded():
            response = error(429, "RateLimitError", str(exc))
            # Whole seconds, at least 1 (RFC 9110 delay-seconds).
            response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
            return response
        case errors.Unauthenticated():
            response = error(401, "AuthenticationError", str(exc))
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        case errors.Unavailable():
            return error(503, "ServiceUnavailableError", str(exc))
        case TimeoutError():
            return error(504, "TimeoutError", str(exc) or "timed out")
        case fastapi.exceptions.RequestValidationError():
            return _validation_error(exc)
        case starlette.exceptions.HTTPException():
            return error(exc.status_code, "HTTPError", str(exc.detail))
        case _:
            log.exception("unhandled error", exc_info=exc)
            return error(500, "InternalServerError", "internal error")


def _validation_error(exc: fastapi.exceptions.RequestValidationError) -> responses.JSONResponse:
    # vLLM and the OpenAI API answer schema violations with 400, not FastAPI's default 422.
    first: dict[str, Any] = exc.errors()[0] if exc.errors() else {}
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path")]
    param = ".".join(loc) or "body"
    return error(400, "BadRequestError", f"{param}: {first.get('msg', 'invalid request')}", param=param)


async def _handle(request: fastapi.Request, exc: Exception) -> responses.JSONResponse:
    return to_response(exc)


def install_error_handlers(app: fastapi.FastAPI) -> None:
    for exc_type in (
        fastapi.exceptions.RequestValidationError,
        starlette.exceptions.HTTPException,
        errors.TreadleError,
        TimeoutError,
        Exception,
    ):
        app.add_exception_handler(exc_type, _handle)
