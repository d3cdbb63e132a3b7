"""Answers validated against their response model on the worker thread that built them.

FastAPI validates a synchronous route's return value against its `response_model` in a
second hop to the thread pool (after the one that ran the route). A busy route builds its
answer here instead, on the thread it already runs on: the same validation (the model's
TypeAdapter, `from_attributes` as FastAPI does), the same JSON (Pydantic's dump_json, by
alias), a ResponseValidationError (500) for an answer that does not match — one hop less.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from fastapi import Response
from fastapi.exceptions import ResponseValidationError
from pydantic import BaseModel, TypeAdapter, ValidationError


@lru_cache(maxsize=16)
def _adapter(model: type[BaseModel]) -> TypeAdapter[Any]:
    return TypeAdapter(model)


def validated_json(model: type[BaseModel], content: Any, *, status_code: int = 200,
                   headers: dict[str, str] | None = None) -> Response:
    """`content` validated as `model` and serialised as FastAPI's response_model would."""
    adapter = _adapter(model)
    try:
        value = adapter.validate_python(content, from_attributes=True)
    except ValidationError as exc:
        errors = [{**error, "loc": ("response", *error["loc"])} for error in exc.errors(include_url=False)]
        raise ResponseValidationError(errors=errors, body=content) from None
    return Response(content=adapter.dump_json(value, by_alias=True), status_code=status_code,
                    media_type="application/json", headers=headers)
