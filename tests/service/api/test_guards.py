"""Request limits, authentication and tenant isolation, and what a client
sees when the server itself fails."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from contextd.api import mapping
from contextd.view_service import ViewService
from contextd_client import (
    NO_RETRY,
    Client,
    ContextdError,
    InvalidArgument,
    NotFound,
    Unauthenticated,
    Unavailable,
    ViewFormat,
)
from contextd_client.v1 import content_pb2 as pb
from contextd_client.v1 import contextd_pb2 as api
from tests import backends, conftest
from tests.conftest import ServerThread
from tests.service.api.test_abandoned_renders import resumed_by_renders

MakeServer = Callable[..., ServerThread]


def user(text: str) -> pb.Item:
    return pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text=text))])


def test_configured_limits_are_enforced_naming_the_field(make_server: MakeServer) -> None:
    server = make_server(max_item_bytes=1000, max_batch_items=3, max_message_bytes=20_000)
    with Client(server.target) as client:
        sid = client.create_session().id
        with pytest.raises(InvalidArgument) as too_many:
            client.append_items(sid, [user("a")] * 4)
        assert (too_many.value.reason, too_many.value.field) == ("LIMIT_EXCEEDED", "items")
        assert "4 items, over the limit of 3 per append (max_batch_items)" in too_many.value.message

        with pytest.raises(InvalidArgument) as too_big:
            client.append_items(sid, [user("a"), user("é" * 600)])
        assert (too_big.value.field, too_big.value.reason) == ("items[1]", "LIMIT_EXCEEDED")
        assert "1,200 bytes, over the limit of 1,000 bytes per item" in too_big.value.message

        # Each item is within its own limits; together they exceed the message limit.
        big = pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text="x" * 900))])
        big.metadata.update({f"k{i}": "v" * 200 for i in range(60)})
        with pytest.raises(InvalidArgument) as oversized:
            client.append_items(sid, [big, big])
        assert oversized.value.field == "request"
        assert "over the limit of 20,000 bytes per message (max_message_bytes)" in oversized.value.message
        assert client.get_session(sid).version == 0


def test_a_view_larger_than_a_message_is_refused_with_the_limit_named(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make_server(max_message_bytes=30_000, max_item_bytes=20_000)
    resumed = resumed_by_renders(monkeypatch)
    with Client(server.target) as client:
        sid = client.create_session().id
        client.append_items(sid, [user("a" * 15_000)])
        client.append_items(sid, [user("b" * 15_000)])
        with pytest.raises(ContextdError) as refused:
            client.render_view(sid, ViewFormat.OPENAI_CHAT)
        client.append_items(sid, [user("c")])
        with pytest.raises(ContextdError) as again:
            client.render_view(sid, ViewFormat.OPENAI_CHAT)
        model_calls = client.get_status(sid).usage.renders
    error = refused.value
    assert (error.code, error.reason) == ("RESOURCE_EXHAUSTED", "VIEW_TOO_LARGE")
    assert int(error.metadata["view_bytes"]) > 30_000 and error.metadata["max_message_bytes"] == "30000"
    assert "render with a budget or raise the limit" in error.message
    assert again.value.reason == "VIEW_TOO_LARGE"
    # Each refused render is stored, as no model call: the next resumes from what it worked
    # out (the carry its engine took), instead of deriving the whole session again.
    assert resumed == [False, True] and model_calls == 0
    conn = sqlite3.connect(server.settings.database_url.removeprefix("sqlite+aiosqlite:///"))
    try:
        assert conn.execute("SELECT view_version FROM view_states").fetchall() == [(2,)]
        told = conn.execute("SELECT body FROM events WHERE kind = 'view_rendered' ORDER BY id").fetchall()
    finally:
        conn.close()
    assert [json.loads(body)["model_call"] for (body,) in told] == [False, False]


def test_a_renders_certificates_never_make_its_view_too_large_to_send(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same logs sixty times over (duplicates to remove) under a budget: the first render
    # decides about each of them, and its certificates outweigh its view.
    server = make_server(max_message_bytes=35_000)
    log = "".join(f"INFO worker {k}: step done\n" for k in range(40))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Why is the worker slow?"}]
    for k in range(60):
        command = {"name": "bash", "arguments": '{"command": "cat w.log"}'}
        call = {"id": f"c{k}", "type": "function", "function": command}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": log},
        ]
    with Client(server.target) as client:
        every, bounded = client.create_session().id, client.create_session().id
        for start in range(0, len(messages), 20):  # appends within the message limit
            client.append_openai(every, messages[start : start + 20])
            client.append_openai(bounded, messages[start : start + 20])
        # Every certificate in the response, as before the bound: refused.
        monkeypatch.setattr(mapping, "RESPONSE_CERTIFICATES", 10_000)
        with pytest.raises(ContextdError) as refused:
            client.render_view(every, ViewFormat.OPENAI_CHAT, budget_tokens=2_000)
        assert refused.value.reason == "VIEW_TOO_LARGE"
        monkeypatch.setattr(mapping, "RESPONSE_CERTIFICATES", 5)
        view = client.render_view(bounded, ViewFormat.OPENAI_CHAT, budget_tokens=2_000)
        listed = list(client.list_certificates(bounded, view_version=view.view_version))
    assert view.certificates_total == len(listed) > 5 == len(view.certificates)
    assert [c.hash for c in view.certificates] == [c.hash for c in listed[:5]]  # the first ones, in order


def test_an_internal_failure_reaches_the_client_without_details(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret: connection string postgres://admin:hunter2@db")

    server = make_server()
    with Client(server.target) as client:
        sid = client.create_session().id
        monkeypatch.setattr(ViewService, "render", broken)
        with pytest.raises(Exception) as failed:
            client.render_view(sid, ViewFormat.OPENAI_CHAT)
    error = failed.value
    assert getattr(error, "code", None) == "INTERNAL"
    text = str(error)
    assert "internal error (reference " in text
    assert "hunter2" not in text and "Traceback" not in text and "RuntimeError" not in text


def test_api_keys_authenticate_and_isolate_tenants(make_server: MakeServer) -> None:
    server = make_server(api_keys="acme:key-a,globex:key-b")
    with Client(server.target) as anonymous, pytest.raises(Unauthenticated) as refused:
        anonymous.create_session()
    assert "authorization: Bearer" in refused.value.message
    with Client(server.target, api_key="wrong") as wrong, pytest.raises(Unauthenticated):
        wrong.create_session()

    with Client(server.target, api_key="key-a") as acme, Client(server.target, api_key="key-b") as globex:
        session = acme.create_session("shared-name")
        assert session.tenant == "acme"
        acme.append_items(session.id, [user("acme's secret plan")])
        with pytest.raises(NotFound):
            globex.get_session("shared-name")
        with pytest.raises(NotFound):
            globex.render_view("shared-name", ViewFormat.OPENAI_CHAT)
        with pytest.raises(NotFound):
            globex.append_items("shared-name", [user("intrusion")])
        # The same id is an independent session in another tenant.
        assert globex.create_session("shared-name").tenant == "globex"
        assert globex.render_openai("shared-name") == []
        assert [s.id for s in globex.list_sessions()] == ["shared-name"]
        assert acme.render_openai("shared-name") == [{"role": "user", "content": "acme's secret plan"}]


def _raw_call(target: str, method: str, data: bytes, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.RpcError:
    """Send `data` as the request of `method`, byte for byte; the error it is answered with."""
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(f"/contextd.v1.ContextService/{method}")
        with pytest.raises(grpc.RpcError) as failed:
            call(data, timeout=15, metadata=metadata)
    return failed.value


def _field(error: grpc.RpcError) -> str:
    return dict(error.trailing_metadata() or ()).get("contextd-field", "")


def test_malformed_request_bytes_are_invalid_arguments_naming_the_field(make_server: MakeServer) -> None:
    server = make_server()
    with Client(server.target) as client:
        sid = client.create_session().id
    item = pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text="MARK"))], metadata={"k": "v"})
    good = api.AppendItemsRequest(session_id=sid, items=[item, item]).SerializeToString()
    cases = [
        (good.replace(b"MARK", b"\xff\xfeRK", 1), "items[0].content[0].text.text", "not valid UTF-8"),
        (good.replace(b"\x12\x01v", b"\x12\x01\xff"), "items[0].metadata.value", "not valid UTF-8"),
        (good[:-4], "items[1]", "truncated"),
        (b"\xff\xff\xff\xff", "request", "truncated"),
        (b"\x07garbage", "<field 0>", "malformed"),
    ]
    for data, field, words in cases:
        error = _raw_call(server.target, "AppendItems", data)
        assert (error.code(), _field(error)) == (grpc.StatusCode.INVALID_ARGUMENT, field), error.details()
        assert words in (error.details() or "")
    with Client(server.target) as client:
        assert client.get_session(sid).version == 0  # refused, so nothing written


def test_numbers_past_the_stored_range_are_invalid_arguments_naming_the_field(make_server: MakeServer) -> None:
    server = make_server()
    with Client(server.target) as client:
        sid = client.create_session().id
        client.append_items(sid, [user("a")])
    huge, largest = 2**64 - 1, 2**63 - 1
    requests = [
        ("ListCertificates", api.ListCertificatesRequest(session_id=sid, seq=huge), "seq"),
        ("ListCertificates", api.ListCertificatesRequest(session_id=sid, view_version=2**63), "view_version"),
        ("ReportUsage", api.ReportUsageRequest(session_id=sid, view_version=huge, provider="openai"), "view_version"),
        ("Pin", api.PinRequest(session_id=sid, seqs=[1, huge]), "seqs[1]"),
        ("ExplainItem", api.ExplainItemRequest(session_id=sid, seq=huge), "seq"),
        (
            "AppendItems",
            api.AppendItemsRequest(session_id=sid, items=[user("b")], expected_version=huge),
            "expected_version",
        ),
        ("RenderView", api.RenderViewRequest(session_id=sid, format=1, budget_tokens=huge), "budget_tokens"),
    ]
    for method, request, field in requests:
        error = _raw_call(server.target, method, request.SerializeToString())
        assert (error.code(), _field(error)) == (grpc.StatusCode.INVALID_ARGUMENT, field), (method, error.details())
    # The largest stored value itself is an ordinary (absent) one.
    with Client(server.target) as client, pytest.raises(InvalidArgument) as no_item:
        client.explain_item(sid, largest)
    assert no_item.value.field == "seq"


def test_two_authorization_headers_are_refused(make_server: MakeServer) -> None:
    server = make_server(api_keys="acme:key-a,globex:key-b")
    request = api.ListSessionsRequest().SerializeToString()
    both = (("authorization", "Bearer key-a"), ("authorization", "Bearer key-b"))
    error = _raw_call(server.target, "ListSessions", request, both)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "2 authorization headers" in (error.details() or "")
    with Client(server.target, api_key="key-b") as globex:
        assert list(globex.list_sessions()) == []


@pytest.mark.postgres
def test_a_database_that_refuses_connections_is_unavailable_with_a_delay(postgres_url: str) -> None:
    with backends.postgres_role(postgres_url) as (url, role):
        server = ServerThread(conftest.test_settings(url)).start()
        try:
            with Client(server.target, retry=NO_RETRY) as client:
                sid = client.create_session().id
                backends.admin(postgres_url, f'ALTER ROLE "{role}" CONNECTION LIMIT 0')
                backends.end_connections(postgres_url, role)
                with pytest.raises(Unavailable) as refused:
                    client.append_items(sid, [user("while it refuses")], idempotency_key="k1")
                assert refused.value.reason == "DATABASE_UNAVAILABLE"
                assert int(refused.value.metadata["retry_after_ms"]) >= 500
                backends.admin(postgres_url, f'ALTER ROLE "{role}" CONNECTION LIMIT -1')
                # The retry (same key) writes it once, and the failed try wrote nothing.
                result = client.append_items(sid, [user("while it refuses")], idempotency_key="k1")
                assert (result.first_seq, result.replayed) == (1, False)
        finally:
            server.stop()


def test_a_tenant_over_its_rate_is_refused_with_a_wait_and_others_are_not(make_server: MakeServer) -> None:
    server = make_server(api_keys="acme:key-a,globex:key-b", tenant_limits='{"acme": {"requests_per_second": 4}}')
    with (
        Client(server.target, api_key="key-a", retry=NO_RETRY) as acme,
        Client(server.target, api_key="key-b") as globex,
    ):
        refused = []
        for _ in range(10):
            try:
                list(acme.list_sessions())
            except ContextdError as exc:
                refused.append(exc)
        assert 5 <= len(refused) <= 6
        error = refused[0]
        assert (error.code, error.reason) == ("RESOURCE_EXHAUSTED", "RATE_LIMITED")
        assert 0 < int(error.metadata["retry_after_ms"]) <= 1000
        for _ in range(10):  # another tenant goes on as if acme were not there
            globex.create_session()
    # The client's own retry waits as told, and the call goes through.
    with Client(server.target, api_key="key-a") as patient:
        for _ in range(8):
            patient.create_session()


def test_an_append_past_the_tenant_s_stored_bytes_is_refused_until_sessions_go(make_server: MakeServer) -> None:
    server = make_server(tenant_stored_bytes=10_000)
    with Client(server.target) as client:
        first = client.create_session().id
        client.append_items(first, [user("a" * 6_000)])
        second = client.create_session().id
        with pytest.raises(ContextdError) as refused:
            client.append_items(second, [user("b" * 6_000)])
        assert (refused.value.code, refused.value.reason) == ("RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED")
        assert "stores 6,000 bytes" in refused.value.message and refused.value.metadata["limit"] == "10000"
        assert client.get_session(second).version == 0
        client.delete_session(first)
        assert client.append_items(second, [user("b" * 6_000)]).first_seq == 1
