"""RenderView's response as the server sends it (api/responses.py): the bytes parse as the
message protobuf would make of the view, the items encoded once serving every render that
shows them again; and a client reads them as it reads any view."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextd.api import responses
from contextd.api.mapping import view_to_proto
from contextd.api.responses import Encoded, known_view, passing_encoded, remember_view, render_response
from contextd.engine.carry_pickle import dump_carry, load_carry
from contextd.engine.certificates import Certificate, Stamp
from contextd.engine.model import Item, Representation
from contextd.engine.pipeline import RenderInput, render
from contextd.engine.policy import default_policy
from contextd.engine.state import ViewState
from contextd.engine.transforms import TransformRegistry
from contextd.engine.view import View, ViewFormat, ViewItem, ViewRequest
from contextd_client import Client
from contextd_client import View as ClientView
from contextd_client import ViewFormat as ClientFormat
from contextd_client._calls import render_view as client_render_view
from contextd_client._held import HeldViews
from contextd_client.v1 import contextd_pb2 as api
from tests.conftest import ServerThread
from tests.helpers import counter, make_session
from tests.service.engine.conversations import conversations
from tests.service.engine.test_carry_strategies import budgeted, file_reads

REGISTRY = TransformRegistry.default()


def _parsed(sent: Encoded) -> api.RenderViewResponse:
    """The response as sent, less its view's token (which protobuf's own message of the view
    has not), checked to be one the server reads back."""
    response = api.RenderViewResponse.FromString(sent.data)
    assert known_view(response.view.view_token) is not None
    response.view.view_token = b""
    return response


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.sampled_from(list(ViewFormat)), st.integers(2, 40), st.sampled_from([0, 300]))
def test_the_encoded_response_is_the_message_protobuf_makes(
    items: list[Item], fmt: ViewFormat, cut: int, budget: int
) -> None:
    request = ViewRequest(fmt, budget_tokens=budget)
    first = render(RenderInput(make_session(cut), items[:cut], default_policy(), request, counter(), REGISTRY))
    later = render(
        RenderInput(
            make_session(len(items)),
            items,
            default_policy(),
            request,
            counter(),
            REGISTRY,
            first.state,
            30.0,
            carry=first.carry,
        )
    )
    held = HeldViews(1)  # a client's, holding the first view for the later render
    for out in (first, later):  # the later render shows most of the first one's items again
        stamp = Stamp(out.state.view_version, fmt.value, "p")
        certificates = [
            Certificate(n, body, stamp, f"{n:064x}", f"{n + 1:064x}") for n, body in enumerate(out.certificates, 1)
        ]
        sent = render_response(out.view, certificates)
        assert _parsed(sent) == api.RenderViewResponse(view=view_to_proto(out.view, certificates))
        # Sent as what changed since the view the client holds, and read by the client as the whole.
        call = client_render_view("s", fmt.value, 0, (), None, views=held)
        token = call.request.known_view_token
        assert bool(token) == (out is later)
        known = known_view(token) if token else None
        read = call.decode(api.RenderViewResponse.FromString(render_response(out.view, certificates, known).data))
        assert read == ClientView.from_proto(api.RenderViewResponse.FromString(sent.data).view)


def test_a_token_is_read_back_as_the_blocks_it_names_and_nothing_else_is() -> None:
    texts = tuple(json.dumps({"role": "user", "content": f"m{n}"}) for n in range(300))
    items = tuple(ViewItem(n, Representation.FULL, 3, n - 1, "") for n in range(1, 301))
    view = View("s", 300, ViewFormat.OPENAI_CHAT, "o200k_base", texts, "", items, 900, 0, 900, 0, False, ())
    token = api.RenderViewResponse.FromString(render_response(view, ()).data).view.view_token
    known = known_view(token)
    assert known is not None and (len(known.messages), len(known.items)) == (2, 2)
    assert all(len(digest) == responses.DIGEST for digest in (*known.messages, *known.items))
    # What a later view shares: the first block of each, then the rest sent.
    later = replace(
        view, message_parts=(*texts, texts[0]), items=(*items[:299], ViewItem(300, Representation.FULL, 4, 299, ""))
    )
    sent = api.RenderViewResponse.FromString(render_response(later, (), known).data).view
    assert sent.shared_messages_bytes == len(("[" + ",".join(texts[: responses.BLOCK])).encode())
    assert sent.shared_items == responses.BLOCK and [i.seq for i in sent.items] == list(range(257, 301))
    assert sent.messages_json == "," + ",".join((*texts[responses.BLOCK :], texts[0])) + "]"
    for bad in (b"", token[:-1], token + b"x", b"\x01\x80"):
        with pytest.raises(ValueError):
            known_view(bad)
    assert known_view(b"\x02" + token[1:]) is None  # another version's: it shares nothing
    assert api.RenderViewResponse.FromString(render_response(view, (), named=False).data).view.view_token == b""


def test_only_an_encoded_response_passes_the_serializer_unchanged() -> None:
    serialize = passing_encoded(api.GetSessionResponse.SerializeToString)
    assert serialize is not None
    assert serialize(Encoded(b"\x0a\x00")) == b"\x0a\x00"
    message = api.GetSessionResponse(session=api.Session(id="s"))
    assert serialize(message) == message.SerializeToString()
    assert passing_encoded(None) is None


def test_a_client_reads_the_view_the_server_encoded(server: ServerThread) -> None:
    with Client(server.target) as client:
        session = client.create_session().id
        client.append_openai(session, [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi."}])
        view = client.render_view(session, ClientFormat.OPENAI_CHAT)
        assert [i.seq for i in view.items] == [1, 2]
        assert view.messages == [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi."}]


def test_a_block_of_items_is_encoded_again_when_any_of_its_items_changed() -> None:
    items = tuple(ViewItem(n, Representation.FULL, 10, n - 1, "") for n in range(1, 601))  # three blocks
    view = View("s", 600, ViewFormat.OPENAI_CHAT, "o200k_base", (), "", items, 6000, 0, 6000, 0, False, ())
    changed = ViewItem(300, Representation.PLACEHOLDER, 3, 299, "h" * 16)
    later = replace(view, items=(*items[:299], changed, *items[300:], ViewItem(601, Representation.FULL, 10, 600, "")))
    for shown in (view, later, view):  # the first view's blocks are remembered; the later one's middle block is not
        parsed = _parsed(render_response(shown, ()))
        assert parsed == api.RenderViewResponse(view=view_to_proto(shown, ()))
    assert [i.representation for i in api.RenderViewResponse.FromString(render_response(later, ()).data).view.items][
        299
    ] == api.REPRESENTATION_PLACEHOLDER


def test_a_block_of_messages_is_encoded_again_when_any_of_its_messages_changed() -> None:
    """The messages' JSON goes out a block of messages at a time, each block encoded once; a
    message changed (a cache breakpoint marked on it), one appended, none at all, or text
    past ASCII: the response is the one protobuf writes from the joined JSON."""
    texts = tuple(json.dumps({"role": "user", "content": f"message {n} \u00e9\u6f22"}) for n in range(600))
    view = View("s", 600, ViewFormat.OPENAI_CHAT, "o200k_base", texts, "", (), 0, 0, 0, 0, False, ())
    marked = json.dumps({"role": "user", "content": [{"type": "text", "text": "m", "cache_control": {}}]})
    later = replace(view, message_parts=(*texts[:299], marked, *texts[300:], texts[0]))
    for shown in (view, later, view, replace(view, message_parts=()), replace(view, message_parts=texts[:1])):
        parsed = _parsed(render_response(shown, ()))
        assert parsed == api.RenderViewResponse(view=view_to_proto(shown, ()))
        assert json.loads(parsed.view.messages_json) == [json.loads(t) for t in shown.message_parts]


def test_a_view_remembered_from_a_carry_read_back_is_encoded_again_only_where_the_next_render_changed_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica that reads a session's carry back as it starts encodes the carry's view then
    (`remember_view`): the response of the render that resumes the carry encodes only the block
    that changed, and is the one protobuf writes."""
    items = file_reads(200)  # 401 items: two blocks
    first = render(budgeted(items, 0, len(items) - 1, ViewState(), None))
    assert first.carry is not None
    read_back = load_carry(dump_carry(first.carry, counter()), items, counter())  # (a process of its own, as it were)
    encoded: list[int] = []
    encode = responses._encode
    monkeypatch.setattr(responses, "_encode", lambda v: encoded.append(v.seq) or encode(v))
    remember_view(*read_back.shown())
    assert len(encoded) == len(first.view.items)
    encoded.clear()
    later = render(budgeted(items, 0, len(items), read_back.state, read_back))
    sent = render_response(later.view, ())
    assert _parsed(sent) == api.RenderViewResponse(view=view_to_proto(later.view, ()))
    assert 0 < len(encoded) <= len(later.view.items) - responses.BLOCK  # the last block's, not the first's


def test_the_blocks_remembered_count_their_bytes_not_the_view_items_and_a_block_let_go_takes_its_weight() -> None:
    """A block of items is remembered with the view items it was encoded from, which the
    session's carry holds: the memo counts the block's bytes and references, not the items
    again. The last block grows an item a render; of the variants remembered for a block the
    oldest goes, and its weight with it."""
    responses._blocks.clear()
    items = [ViewItem(n, Representation.FULL, 10, n - 1, "") for n in range(1, 201)]  # one block, growing
    weights = []
    for n in range(150, 201):
        view = View(
            "s", n, ViewFormat.OPENAI_CHAT, "o200k_base", (), "", tuple(items[:n]), 10 * n, 0, 10 * n, 0, False, ()
        )
        encoded = render_response(view, ()).data
        weights.append(responses._blocks.bytes)
    held = len(encoded)  # (the last block's bytes are most of the response)
    variants = responses.BLOCK_VARIANTS
    assert weights[-1] < variants * (held + 8 * 200) + 4096  # not the items: 200 of them weigh 40 KB
    # Each render adds a variant one item longer than the newest and, from the fifth, lets go of
    # one four items shorter: a few items' worth, not a variant's weight (2 KB and more).
    grown = [later - earlier for earlier, later in zip(weights[variants:], weights[variants + 1 :], strict=False)]
    assert 0 < max(grown) < variants * 40
    responses._blocks.clear()
