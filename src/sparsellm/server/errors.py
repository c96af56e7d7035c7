"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, for every route.

Validation problems are HTTP 400 (never 422), unexpected failures a generic 500 without a
traceback; messages never carry file paths.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("sparsellm.server")

INVALID_REQUEST = "invalid_request_error"
_TYPES = {401: "authentication_error", 403: "permission_error", 404: INVALID_REQUEST,
          413: INVALID_REQUEST, 429: "rate_limit_error", 500: "server_error",
          503: "service_unavailable"}
# pydantic puts union members and validator kinds into `loc`; they are not field names
_LOC_NOISE = re.compile(r"[\[\]\-,]|^(str|int|float|bool|list|dict|none|literal)$")


class APIError(Exception):
    """An error a handler returns to the client as is."""

    def __init__(self, status: int, message: str, *, type: str | None = None,
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _TYPES.get(status, INVALID_REQUEST)
        self.headers = headers


def error_body(message: str, type: str = INVALID_REQUEST, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(error_body(e.message, e.type, e.param, e.code), status_code=e.status,
                        headers=e.headers)


def error_bytes(status: int, message: str, code: str | None = None) -> bytes:
    """The JSON body of an error, for the ASGI middleware that answers without FastAPI."""
    return json.dumps(error_body(message, _TYPES.get(status, INVALID_REQUEST), None,
                                 code)).encode()


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(message, param) for the first pydantic error, phrased for an API user."""
    if not errors:
        return "invalid request", None
    err = _relevant(errors)
    kind = err.get("type", "")
    loc = _field_path(err)
    if loc and loc[0] == "body":
        loc = loc[1:]
    param = ".".join(loc) or None
    if kind == "json_invalid":
        detail = (err.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON ({detail})".replace(" ()", ""), None
    if kind == "missing" and not loc:
        return "the request body is missing: send a JSON object", None
    if kind == "missing":
        return f"missing required field '{param}'", param
    if kind == "extra_forbidden":
        return f"unknown field '{param}'", param
    if kind in ("model_attributes_type", "dict_type", "model_type") and not loc:
        return "the request body must be a JSON object", None
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    expected = _union_types(errors, loc) if kind.endswith("_type") else []
    if len(expected) > 1:  # every member of a union refused the value's type
        msg = f"expected {' or '.join(expected)}"
    return (f"invalid '{param}': {msg}" if param else msg), param


_TYPE_NAMES = {"string_type": "a string", "list_type": "a list", "int_type": "an integer",
               "bool_type": "a boolean", "float_type": "a number", "dict_type": "an object",
               "model_type": "an object", "model_attributes_type": "an object"}


def _union_types(errors: list[dict[str, Any]], loc: list[str]) -> list[str]:
    """The types the union at `loc` accepts, from its members' type errors."""
    names = [_TYPE_NAMES.get(str(e.get("type")), "") for e in errors
             if _field_path(e)[1:] == loc and str(e.get("type", "")).endswith("_type")]
    return list(dict.fromkeys(n for n in names if n))


def _field_path(err: dict[str, Any]) -> list[str]:
    return [str(p) for p in err.get("loc", ()) if not _LOC_NOISE.search(str(p))]


def _relevant(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The first error, unless it is a union member's type mismatch (`stop`: "should be a
    valid string" for a list) and another member of the same field failed for a real reason."""
    first = errors[0]
    if not str(first.get("type", "")).endswith("_type"):
        return first
    field = _field_path(first)
    for err in errors[1:]:
        if _field_path(err)[:len(field)] == field and \
                not str(err.get("type", "")).endswith("_type"):
            return err
    return first


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(e.errors()))
        return error_response(APIError(400, message, param=param))

    @app.exception_handler(json.JSONDecodeError)
    async def _json(request: Request, e: json.JSONDecodeError) -> JSONResponse:
        return error_response(APIError(400, f"the request body is not valid JSON ({e.msg})"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        status = e.status_code
        if status == 400:  # FastAPI's "There was an error parsing the body"
            message = "the request body could not be parsed; send a JSON object"
        elif status == 404:
            message = f"no route {request.url.path}"
        elif status == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(e.detail)
        return error_response(APIError(status, message,
                                       code="not_found" if status == 404 else None,
                                       headers=getattr(e, "headers", None)))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(APIError(500, "internal server error"))
