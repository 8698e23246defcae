"""Page tokens read back only as this service wrote them."""

from __future__ import annotations

import base64

import pytest

from contextd.engine.errors import InvalidArgument
from contextd_storage import page_tokens


def _raw(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


def test_a_token_names_the_key_it_was_made_from() -> None:
    assert page_tokens.decode("after", page_tokens.encode("after", 41)) == 41
    assert page_tokens.decode("after", "") == 0
    assert page_tokens.decode("after", page_tokens.encode("after", 2**63 - 1)) == 2**63 - 1


@pytest.mark.parametrize(
    "token",
    [
        page_tokens.encode("certificate", 3),  # another listing's
        _raw("after:" + str(2**63)),  # past a BIGINT
        _raw("after:" + "9" * 5000),  # past what int() converts
        _raw("after:+5"),
        _raw("after: 5"),
        _raw("after:1_0"),
        _raw("after:²"),
        _raw("after:-1"),
        "not base64!",
        "////",
        "a" * 10_000,
    ],
)
def test_anything_else_is_an_invalid_page_token(token: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        page_tokens.decode("after", token)
    assert refused.value.violations[0].field == "page_token"
