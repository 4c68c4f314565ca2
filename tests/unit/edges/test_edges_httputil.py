"""The error shape at the server edge and its mapping back to treadle.errors at the client."""

from __future__ import annotations

import json

import grpc
import pytest

from treadle import errors
from treadle.services.grpcutil import status as grpc_status
from treadle.services.httputil import client
from treadle.services.httputil import errors as http_errors


@pytest.mark.parametrize(
    ("exc", "code", "type_", "param"),
    [
        (errors.SpecError("must be positive", field="max_tokens"), 400, "BadRequestError", "max_tokens"),
        (http_errors.PayloadTooLarge("too big", field="body"), 413, "PayloadTooLarge", "body"),
        (errors.NotFound("session 'x' is not open"), 404, "NotFoundError", None),
        (errors.Conflict("busy"), 409, "ConflictError", None),
        (errors.Unavailable("draining"), 503, "ServiceUnavailableError", None),
        (errors.Overloaded("queue full"), 429, "RateLimitError", None),
        (TimeoutError("slow"), 504, "TimeoutError", None),
        (RuntimeError("secret internals"), 500, "InternalServerError", None),
    ],
    ids=["spec", "too-large", "not-found", "conflict", "unavailable", "overloaded", "timeout", "unexpected"],
)
def test_to_response(exc: Exception, code: int, type_: str, param: str | None) -> None:
    response = http_errors.to_response(exc)
    body = json.loads(bytes(response.body))
    assert response.status_code == code
    assert (
        body["error"]["type"] == type_ and body["error"]["param"] == param and body["error"]["code"] == code
    )
    assert "secret" not in body["error"]["message"]  # tracebacks and internals never reach clients


def response(code: int, error: dict[str, object] | None = None, text: str | None = None) -> tuple[int, bytes]:
    if text is not None:
        return code, text.encode()
    body = {"error": {"message": "m", "type": "T", "param": None, "code": code, **(error or {})}}
    return code, json.dumps(body).encode()


@pytest.mark.parametrize(
    ("resp", "kind", "field"),
    [
        (response(400, {"param": "env", "message": "env: unknown"}), errors.SpecError, "env"),
        (response(422, {}), errors.SpecError, "body"),
        (response(413, {"param": "body"}), errors.SpecError, "body"),
        (response(404), errors.NotFound, None),
        (response(409), errors.Conflict, None),
        (response(429), errors.Overloaded, None),
        (response(500), errors.Unavailable, None),
        (response(503), errors.Unavailable, None),
        (response(502, text="<html>bad gateway</html>"), errors.Unavailable, None),
    ],
    ids=["400-param", "422", "413", "404", "409", "429", "500", "503", "502-not-json"],
)
def test_from_response(resp: tuple[int, bytes], kind: type[Exception], field: str | None) -> None:
    exc = client.from_response(*resp)
    assert isinstance(exc, kind)
    if field is not None:
        assert isinstance(exc, errors.SpecError) and exc.field == field


def test_spec_error_message_is_not_prefixed_twice() -> None:
    exc = client.from_response(*response(400, {"param": "env", "message": "env: unknown environment"}))
    assert str(exc) == "env: unknown environment"


@pytest.mark.parametrize(
    ("retry_after_s", "header"), [(0.2, "1"), (1.0, "1"), (2.5, "3")], ids=["sub", "one", "up"]
)
def test_overloaded_says_when_to_retry(retry_after_s: float, header: str) -> None:
    response = http_errors.to_response(errors.Overloaded("queue full", retry_after_s=retry_after_s))
    assert response.status_code == 429 and response.headers["Retry-After"] == header


def test_overloaded_is_resource_exhausted_both_ways() -> None:
    code, message = grpc_status.to_status(errors.Overloaded("pending queue full"))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and message == "pending queue full"
    rpc_error = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=message)
    assert isinstance(grpc_status.from_rpc_error(rpc_error, what="scheduler.Submit"), errors.Overloaded)
