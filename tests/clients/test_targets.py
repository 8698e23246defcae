"""A client over several replicas: targets lists and URIs, round robin, a dead
replica skipped, a restarted one waited for within the retry budget."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from contextd_client import AsyncClient, Client, ContextdError, RetryPolicy
from contextd_client._channel import ChannelConfig, channel_targets
from contextd_client.v1 import content_pb2 as pb
from contextd_lab.service import ServerProcess
from tests.conftest import ServerThread

MakeServer = Callable[..., ServerThread]


def free_port() -> int:
    """A loopback port nothing listens on (until someone takes it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def port_of(server: ServerThread) -> int:
    return int(server.target.rsplit(":", 1)[1])


def user(text: str) -> pb.Item:
    return pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text=text))])


class CountCalls(grpc.aio.ServerInterceptor):
    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        self.seen[details.method.rsplit("/", 1)[-1]] += 1
        return await continuation(details)


# ------------------------------------------------------------- targets


def test_one_target_is_used_as_given() -> None:
    assert channel_targets("127.0.0.1:50051") == ("127.0.0.1:50051",)
    assert channel_targets("dns:///contextd.internal:50051") == ("dns:///contextd.internal:50051",)
    assert channel_targets(["contextd.internal:50051"]) == ("contextd.internal:50051",)


def test_ip_addresses_of_one_family_become_one_balanced_channel() -> None:
    assert channel_targets(["10.0.0.1:50051", "10.0.0.2:50052"]) == ("ipv4:10.0.0.1:50051,10.0.0.2:50052",)
    assert channel_targets(("[::1]:50051", "[fd00::2]:50051")) == ("ipv6:[::1]:50051,[fd00::2]:50051",)


@pytest.mark.parametrize(
    "targets",
    [
        ["replica-a:50051", "replica-b:50051"],
        ["10.0.0.1:50051", "[::1]:50051"],  # two families: no one URI holds both
        ["10.0.0.1:50051", "dns:///contextd.internal:50051"],
        ["10.0.0.1", "10.0.0.2"],  # no port
    ],
)
def test_other_lists_open_a_channel_per_target(targets: list[str]) -> None:
    assert channel_targets(targets) == tuple(targets)


@pytest.mark.parametrize("targets", [[], [""]])
def test_no_target_is_refused(targets: list[str]) -> None:
    with pytest.raises(ValueError):
        channel_targets(targets)


def test_channels_balance_round_robin_unless_told_otherwise() -> None:
    def options(given: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
        return dict(ChannelConfig(("x:1",), None, 1.0, RetryPolicy(), None, given)._options())

    default = options(())
    assert '"round_robin"' in default["grpc.service_config"]
    assert default["grpc.max_reconnect_backoff_ms"] <= 5000
    chosen = options((("grpc.lb_policy_name", "pick_first"),))
    assert chosen["grpc.lb_policy_name"] == "pick_first" and "grpc.service_config" not in chosen
    assert options((("grpc.max_reconnect_backoff_ms", 60_000),))["grpc.max_reconnect_backoff_ms"] == 60_000


# ------------------------------------------------------------ replicas


def test_calls_are_spread_over_the_replicas(make_server: MakeServer) -> None:
    counters = [CountCalls(), CountCalls()]
    servers = [make_server(interceptors=[c]) for c in counters]
    with Client([s.target for s in servers]) as client:
        for _ in range(40):
            list(client.list_sessions())
    assert [c.seen["ListSessions"] for c in counters] != [40, 0]
    assert all(c.seen["ListSessions"] >= 5 for c in counters), [c.seen for c in counters]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"], ids=["ip-addresses", "host-names"])
def test_a_dead_replica_is_skipped(make_server: MakeServer, host: str) -> None:
    server = make_server()
    targets = [f"{host}:{free_port()}", f"{host}:{port_of(server)}"]
    with Client(targets, timeout=10) as client:
        session_id = client.create_session().id
        for n in range(15):
            client.append_items(session_id, [user(f"item {n}")])
            assert client.get_session(session_id).version == n + 1
        assert len(client.render_view(session_id, "openai_chat").messages) == 15


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"], ids=["ip-addresses", "host-names"])
async def test_the_async_client_skips_a_dead_replica_too(make_server: MakeServer, host: str) -> None:
    server = make_server()
    targets = [f"{host}:{free_port()}", f"{host}:{port_of(server)}"]
    async with AsyncClient(targets, timeout=10) as client:
        session_id = (await client.create_session()).id
        for n in range(15):
            await client.append_items(session_id, [user(f"item {n}")])
            assert (await client.get_session(session_id)).version == n + 1


def test_a_call_made_while_the_only_server_restarts_succeeds_once_it_is_back(tmp_path: Path) -> None:
    port = free_port()
    listen = ("--listen", f"127.0.0.1:{port}")  # after ServerProcess's own --listen: this one wins
    first = ServerProcess(*listen, cwd=tmp_path).wait_serving()
    assert first.port == port
    # The default budget (30 s) rides out a restart; a child process starting on a loaded
    # machine may take longer than a real replica, so this test allows more.
    budget = 90.0
    with Client(f"127.0.0.1:{port}", timeout=10, retry=RetryPolicy(budget=budget)) as client:
        try:
            session_id = client.create_session().id
        finally:
            first.stop()
        results: dict[str, object] = {}

        def call(name: str, run: Callable[[], object]) -> threading.Thread:
            def target() -> None:
                try:
                    results[name] = run()
                except ContextdError as error:
                    results[name] = error

            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            return thread

        started = time.monotonic()
        calls = [
            call("read", lambda: client.get_session(session_id).id),
            call("append", lambda: client.append_items(session_id, [user("while down")]).first_seq),
        ]
        time.sleep(2)
        assert results == {}  # both still trying: nobody is there to answer
        second = ServerProcess(*listen, cwd=tmp_path)
        try:
            second.wait_serving()
            for thread in calls:
                thread.join(timeout=40)
            assert results == {"read": session_id, "append": 1}
            assert 2 < time.monotonic() - started < budget
            assert client.get_session(session_id).version == 1  # the append, once
        finally:
            second.stop()
