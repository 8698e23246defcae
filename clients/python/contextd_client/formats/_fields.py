"""Reading provider dicts: malformed input is a ValueError naming the field,
never a KeyError, AttributeError or TypeError from deep inside."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any


def require_object(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{path}: expected an object, not {type(value).__name__}")
    return value


def require_string(obj: Mapping[str, Any], key: str, path: str) -> str:
    """The required string field `key` of `obj`."""
    value = obj.get(key)
    if value is None:
        raise ValueError(f"{path}.{key}: missing")
    if not isinstance(value, str):
        raise ValueError(f"{path}.{key}: expected a string, not {type(value).__name__}")
    return value


def decode_base64(data: str, path: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"{path}: bad base64 ({exc})") from None


def data_uri(url: str, path: str) -> tuple[str, bytes] | None:
    """(media type, bytes) of a base64 data URI; None for any other URL."""
    if not url.startswith("data:"):
        return None
    header, sep, payload = url[5:].partition(",")
    media_type, *parameters = header.split(";")
    if not sep or not parameters or parameters[-1] != "base64":
        raise ValueError(f"{path}: only base64 data URIs are supported")
    return media_type, decode_base64(payload, path)
