"""Settings refused at start-up with one line: keys that name two tenants, TLS half given, a
message limit gRPC cannot take."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from contextd.config import ConfigError, Settings
from contextd.warm_start import share_of
from contextd_client import Client
from tests.conftest import ServerThread


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ("a:k,b:k", "tenant 'b' has a key that is listed already for tenant 'a'"),
        ("a:k,a:k", "tenant 'a' has a key that is listed already for it"),
    ],
)
def test_a_key_names_one_tenant_once(keys: str, words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings(api_keys=keys).validate()
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_a_tenant_may_have_several_keys_while_rotating() -> None:
    assert Settings(api_keys="a:old,a:new,b:k").tenant_keys() == {"old": "a", "new": "a", "k": "b"}


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"tls_cert": "c.pem"}, "tls_cert and tls_key go together"),
        ({"tls_key": "k.pem"}, "tls_cert and tls_key go together"),
        ({"tls_client_ca": "ca.pem"}, "mutual TLS is TLS first"),
    ],
)
def test_tls_settings_go_together(settings: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        Settings(**settings).validate()  # type: ignore[arg-type]


def test_a_message_limit_grpc_cannot_take_is_refused_and_the_largest_it_can_serves(
    make_server: Callable[..., ServerThread],
) -> None:
    with pytest.raises(ConfigError, match=r"max_message_bytes must be at most 1073741824 \(1 GiB\), not 1073741825"):
        Settings(max_message_bytes=(1 << 30) + 1).validate()
    server = make_server(max_message_bytes=1 << 30)  # receives up to twice it: capped at gRPC's largest
    with Client(server.target) as client:
        assert client.create_session().id


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"carry_secret": "s" * 32}, "carry_secret signs what is kept in Redis: set redis_url too"),
        ({"carry_secret": "short", "redis_url": "redis://127.0.0.1:6379/0"}, "16 characters or more, not 5"),
        (
            {"carry_secret": "CHANGE-ME-TO-32-RANDOM-CHARACTERS", "redis_url": "redis://127.0.0.1:6379/0"},
            "a placeholder",
        ),
    ],
)
def test_a_carry_secret_needs_redis_and_sixteen_characters(settings: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        Settings(**settings).validate()  # type: ignore[arg-type]


def test_the_carry_secret_is_never_displayed() -> None:
    secret = "a-secret-of-the-deployment-0123456789"
    shown = Settings(redis_url="redis://127.0.0.1:6379/0", carry_secret=secret).redacted()
    assert shown["carry_secret"] == "***" and secret not in repr(shown)


@pytest.mark.parametrize("share", ["1", "2/2", "-1/2", "a/b", "1/0", "0/2/3"])
def test_a_render_share_is_an_index_below_a_count(share: str) -> None:
    with pytest.raises(ConfigError, match="render_share"):
        Settings(render_share=share).validate()


def test_a_render_share_names_the_process_and_the_processes() -> None:
    Settings(render_share="1/2").validate()
    assert share_of("1/2") == (1, 2) and share_of("") is None
