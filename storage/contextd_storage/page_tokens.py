"""Page tokens: where a listing stopped, handed to the client and read back.

A token is the key of the last row a page held, named by its kind
(``after:41`` for sessions, ``certificate:7`` for certificates), in URL-safe
base64. The client treats it as opaque; anything else it sends back is
INVALID_ARGUMENT, never a query with a number the database cannot hold.
"""

from __future__ import annotations

import base64
import binascii

from contextd.engine.errors import InvalidArgument

_LARGEST_KEY = 2**63 - 1


def encode(kind: str, key: int) -> str:
    return base64.urlsafe_b64encode(f"{kind}:{key}".encode()).decode()


def decode(kind: str, token: str) -> int:
    """The key `token` names (0 for the first page); InvalidArgument unless this service issued it."""
    if not token:
        return 0
    if len(token) > 64:  # far longer than any issued: not decoded at all
        raise InvalidArgument.at("page_token", "not a page token this service issued")
    try:
        prefix, _, value = base64.urlsafe_b64decode(token.encode()).decode().partition(":")
    except (ValueError, binascii.Error, UnicodeDecodeError):
        prefix, value = "", ""
    # Digits only (int() would also take "+5", " 5", "1_0" and "²"), within a BIGINT.
    if prefix != kind or not (value.isascii() and value.isdigit() and len(value) <= 19) or int(value) > _LARGEST_KEY:
        raise InvalidArgument.at("page_token", "not a page token this service issued")
    return int(value)
