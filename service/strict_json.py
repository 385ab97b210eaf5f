"""JSON request bodies read strictly: no byte order mark, no key twice in one object.

Python's ``json`` (what Starlette's ``Request.json`` uses) skips a UTF-8 byte order mark and keeps
the last of two equal keys, so ``{"engine": "simulation", "engine": "external"}`` would be read as
an external audit while a proxy or log reading the first key sees a simulation. Both are refused
with a 422 that names the field. Routers opt in with ``APIRouter(route_class=StrictJSONRoute)``;
bodies of other media types (the binary round data) pass untouched, and a body that is not JSON at
all gets FastAPI's own answer (422 ``json_invalid``, 400 for bytes that are not UTF-8).
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

__all__ = ["DuplicateKey", "StrictJSONRoute", "is_json_media", "strict_json_loads"]

BOM = b"\xef\xbb\xbf"


class DuplicateKey(ValueError):
    """A JSON object names ``key`` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise DuplicateKey(key)
        obj[key] = value
    return obj


def strict_json_loads(text: str) -> Any:
    """``json.loads`` that raises :class:`DuplicateKey` for a key given twice in one object."""
    return json.loads(text, object_pairs_hook=_unique_pairs)


def is_json_media(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this ``Content-Type`` as JSON."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _refusal(loc: tuple, msg: str, kind: str, value: Any) -> RequestValidationError:
    return RequestValidationError(
        [{"type": kind, "loc": ("body", *loc), "msg": msg, "input": value}]
    )


async def check_json_body(request: Request) -> None:
    """Raise a 422 :class:`RequestValidationError` for a JSON body with a byte order mark or a
    duplicate key; leave every other body (and JSON syntax errors) to FastAPI."""
    if not is_json_media(request.headers.get("content-type")):
        return
    body = await request.body()  # cached on the request: the route handler reads it again
    if body.startswith(BOM):
        raise _refusal(
            (),
            "JSON body starts with a byte order mark (U+FEFF); send plain UTF-8 "
            "(RFC 8259 section 8.1)",
            "json_byte_order_mark",
            None,
        )
    try:
        strict_json_loads(body.decode("utf-8"))
    except DuplicateKey as error:
        raise _refusal(
            (error.key,),
            f"duplicate key {error.key!r}: a key may appear once in an object",
            "json_duplicate_key",
            error.key,
        ) from None
    except ValueError:  # not UTF-8, or not JSON: FastAPI's own 400 / 422 follows
        return


class StrictJSONRoute(APIRoute):
    """An ``APIRoute`` whose JSON bodies pass :func:`check_json_body` first."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def strict_handler(request: Request) -> Response:
            await check_json_body(request)
            return await handler(request)

        return strict_handler
