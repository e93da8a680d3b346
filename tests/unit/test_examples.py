"""The bot examples, driven through discord.py's and slack-bolt's own objects, offline.

Events land on fakeredis (decoded with the contract's codec); the read model is a fake
with AsyncContextReader's methods. Discord: a real `discord.Client` logs in against a
fake REST API (an `HTTPClient` whose `request` answers in memory) and gets real
`discord.Message` and `discord.Interaction` objects, the way discord.py's own tests build
them; interaction responses go to a recording webhook adapter, set in the contextvar
discord.py reads it from. Slack: real request bodies go through `AsyncApp.async_dispatch`;
the Web API and the slash command's response_url are a small aiohttp app on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlencode

import fakeredis
import httpx2
import msgspec
import pytest

# discord.py 2.7 imports the stdlib `audioop` (for voice), deprecated since Python 3.11
# (PEP 594); importing the module is all this warning is about. It is raised at import,
# during collection, where a `pytestmark` filter does not reach.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    import discord
    from discord.http import HTTPClient, Route
    from discord.webhook.async_ import AsyncWebhookAdapter, async_context

import anthropic
from aiohttp import web
from aiohttp.test_utils import TestServer
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.web.async_client import AsyncWebClient

from contextlog.producers import (
    AsyncContextReader,
    AsyncNotifications,
    AsyncProducer,
    ConfigError,
    Context,
    SessionPage,
    Unavailable,
)
from contextlog.producers.context import SystemMessages
from contextlog.producers.history import SessionInfo
from contextlog.producers.search import RANK_WINDOW, Scope, SearchHit, SearchPage, params
from contextlog.schema import codec, keys
from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.schema.notices import Notice
from contextlog.worker.effects.notify import RedisNotifier
from examples import discord_bot as db
from examples import slack_bot as sb
from tests.support.fake_anthropic import FakeAPI, Outcome
from tests.support.readers import parameters

T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
SHARDS = 4
AGENT = "alpha"


# -- shared fakes ---------------------------------------------------------------------


def producer(server: fakeredis.FakeServer) -> AsyncProducer:
    return AsyncProducer(fakeredis.FakeAsyncRedis(server=server), shards=SHARDS, clock=lambda: T0)


def pushed(server: fakeredis.FakeServer) -> list[ev.AnyEvent]:
    """Every event on the inbound streams, decoded as ingest decodes them."""
    client: Any = fakeredis.FakeRedis(server=server)
    entries: list[tuple[bytes, dict[bytes, bytes]]] = [
        e for s in range(SHARDS) for e in client.xrange(keys.stream(s))
    ]
    entries.sort(key=lambda e: tuple(int(p) for p in e[0].split(b"-")))
    return [codec.decode_fields(fields) for _, fields in entries]


def session(sid: str, *, summary: str | None = "We fixed the login bug.") -> SessionInfo:
    return SessionInfo(
        session_id=sid,
        agent=AGENT,
        channel="c",
        created_at=T0,
        description="login bug",
        summary=summary,
        message_count=4,
        token_estimate=120,
        auto=summary is None,
        preview="the login fails",
    )


def hit(sender: str | None, snippet: str, sessions: list[str], *, role: str = "user") -> SearchHit:
    said = dt.datetime(2026, 11, 22, 13, 5, 59, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    return SearchHit(
        agent=AGENT,
        channel="c",
        thread="",
        seq=3,
        event_id="e3",
        at=T0,
        occurred_at=said,  # 12:05:59 UTC
        sender=sender,
        role=role,
        snippet=snippet,
        sessions=sessions,
    )


class FakeReader:
    """AsyncContextReader's methods: the context holds the awaited message; a search
    refuses what the real one refuses (the library's own check) and returns `results`."""

    def __init__(
        self,
        server: fakeredis.FakeServer,
        page: SessionPage | None = None,
        results: SearchPage | None = None,
    ) -> None:
        self.server = server
        self.page = page or SessionPage([], 1, 10, 0)
        self.results = results or SearchPage("", [], 1, 10, 0)
        self.calls: list[tuple[Any, ...]] = []

    async def context(
        self,
        agent: str,
        channel: str,
        thread: str | None = None,
        *,
        wait_for: str | None = None,
        timeout: float = 2.0,
        system_messages: SystemMessages | None = None,
    ) -> Context:
        self.calls.append(("context", agent, channel, thread, wait_for))
        found = [e for e in pushed(self.server) if str(e.event_id) == wait_for]
        assert found, f"wait_for={wait_for} names no pushed event"
        message = found[0]
        assert isinstance(message, ev.MessagePosted) and isinstance(message.content, str)
        turn = {"role": "user", "content": [{"type": "text", "text": message.content}]}
        return Context(messages=[turn], token_estimate=7)

    async def sessions(
        self, agent: str, channel: str | None = None, *, page: int = 1, per_page: int = 10
    ) -> SessionPage:
        self.calls.append(("sessions", agent, channel, page, per_page))
        return self.page

    async def search(
        self,
        agent: str,
        query: str,
        *,
        channel: str | None = None,
        thread: str | None = None,
        sender: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        page: int = 1,
        per_page: int = 10,
    ) -> SearchPage:
        self.calls.append(("search", agent, query, channel, thread, sender, page, per_page))
        params(agent, query, Scope(channel, thread, sender, since, until), page, per_page)
        return self.results


@pytest.mark.parametrize("name", ["context", "sessions", "search"])
def test_the_fake_reader_takes_what_the_real_one_takes(name: str) -> None:
    """A bot's call the real reader would not accept must fail here too."""
    assert parameters(getattr(FakeReader, name)) == parameters(getattr(AsyncContextReader, name))


def notice(i: int, kind: str, channel: str, **fields: Any) -> Notice:
    base = {"notice_id": f"n{i}", "kind": kind, "agent": AGENT, "channel": channel}
    return Notice(occurred_at=T0, **(base | fields))


def publish(server: fakeredis.FakeServer, source: str, *items: Notice) -> None:
    RedisNotifier(fakeredis.FakeRedis(server=server)).publish([(source, n) for n in items])


class Waiter:
    """Records items; `wait(n)` returns once there are n (the relay runs in a task)."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._changed = asyncio.Event()

    def add(self, item: Any) -> None:
        self.items.append(item)
        self._changed.set()

    async def wait(self, n: int) -> list[Any]:
        while len(self.items) < n:
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), 5)
        return self.items


def without_ids(events: list[ev.AnyEvent]) -> list[tuple[str, dict[str, Any]]]:
    """(tag, fields set) of each event, without its event id and time."""
    out = []
    for e in events:
        fields = msgspec.json.decode(codec.encode(e))  # the wire form omits defaults
        del fields["event_id"], fields["occurred_at"]
        out.append((fields.pop("type"), fields))
    return out


# -- helpers of both examples ---------------------------------------------------------


@pytest.mark.parametrize("bot", [db, sb])
def test_settings_are_parsed_or_refused_with_the_reason(bot: Any) -> None:
    assert bot.parse_settings("10m", "24h", 8000) == {
        "idle_timeout": 600,
        "rolling_window": 86400,
        "token_budget": 8000,
    }
    assert bot.parse_settings("0", None, None) == {"idle_timeout": 0}
    for args, reason in [
        (("ten minutes", None, None), "not a duration: 'ten minutes'"),
        ((None, "0", None), "window must be between 1s and 366d"),
        ((None, "400d", None), "window must be between 1s and 366d"),
        ((None, None, "0"), "budget must be a number of tokens"),
        ((None, None, None), "give at least one setting"),
    ]:
        with pytest.raises(ValueError, match=reason):
            bot.parse_settings(*args)


@pytest.mark.parametrize("bot", [db, sb])
def test_notices_are_described_for_people(bot: Any) -> None:
    auto = notice(1, nt.SUMMARY_READY, "c", session_id="s1", text="We met.", auto=True)
    assert bot.describe(auto) == "Saved after inactivity: We met.\n(`/context restore s1`)"
    refused = notice(2, nt.COMMAND_REFUSED, "c", text="there is no session 'x'")
    assert bot.describe(refused) == "Refused: there is no session 'x'"
    saved = notice(3, nt.SESSION_SAVED, "c", session_id="s1", text="saved session s1 (4 messages)")
    assert bot.describe(saved) == "Saved session s1 (4 messages)."
    assert bot.describe(notice(4, nt.SESSION_SAVED, "c", auto=True)) is None
    assert bot.describe(notice(5, nt.CONTEXT_COMPACTED, "c")) is None
    assert bot.describe(notice(6, "a_future_kind", "c")) is None


@pytest.mark.parametrize("bot", [db, sb])
def test_history_page_lists_sessions_with_summaries(bot: Any) -> None:
    page = SessionPage([session("2026-11-22_login-bug"), session("s2", summary=None)], 1, 10, 12)
    assert bot.format_history(page).splitlines() == [
        "Saved sessions, page 1 of 2 (12 in all):",
        "- `2026-11-22_login-bug`, 4 messages: login bug",
        "  We fixed the login bug.",
        "- `s2` (auto-saved), 4 messages: login bug",
        "  (summary pending)",
    ]
    assert "No saved sessions yet" in bot.format_history(SessionPage([], 1, 10, 0))
    assert bot.format_history(SessionPage([], 3, 10, 4)) == (
        "There is no page 3: the history has 1."
    )


@pytest.mark.parametrize(("bot", "b", "ada"), [(db, "**", "7"), (sb, "*", "U1")])
def test_search_page_shows_when_who_the_words_found_and_their_sessions(
    bot: Any, b: str, ada: str
) -> None:
    page = SearchPage(
        "rollback `plan`",
        [
            hit(ada, "we need a **rollback** **plan** today", ["2026-11-22_login-bug", "s2"]),
            hit(None, "the **rollback** is done", [], role="assistant"),
        ],
        1,
        2,
        3,
    )
    assert bot.format_search(page).splitlines() == [
        "Messages matching `rollback plan`, page 1 of 2 (3 found):",
        f"- 2026-11-22 12:05 UTC, user <@{ada}>: we need a {b}rollback{b} {b}plan{b} today",
        "  in `2026-11-22_login-bug`, `s2`",
        f"- 2026-11-22 12:05 UTC, assistant: the {b}rollback{b} is done",
        "  in no saved session",
        "`/context restore <id>` brings a session back.",
    ]
    assert bot.format_search(SearchPage("x", [], 1, 10, 0)) == (
        "No message in this channel matches `x`."
    )
    assert bot.format_search(SearchPage("x", [], 3, 10, 4)) == (
        "There is no page 3: the search has 1."
    )
    capped = SearchPage("x", [hit("bob", "**x**", [])], 1, 10, RANK_WINDOW)
    assert bot.format_search(capped).splitlines() == [
        "Messages matching `x`, page 1 of 100 (1000+ found):",
        f"- 2026-11-22 12:05 UTC, user bob: {b}x{b}",  # not an id: no mention
        "  in no saved session",
    ]


@pytest.mark.parametrize(("bot", "b"), [(db, "**"), (sb, "*")])
def test_a_long_snippet_is_cut_on_a_word_with_its_highlight_closed(bot: Any, b: str) -> None:
    words = " ".join(f"word{i}" for i in range(100))
    line = bot.format_search(SearchPage("w", [hit(None, f"**{words}**", [])], 1, 10, 1))
    shown = line.splitlines()[1].removeprefix("- 2026-11-22 12:05 UTC, user: ")
    assert shown.startswith(f"{b}word0 word1 ") and shown.endswith(f"{b} …")
    assert len(shown) <= bot.SNIPPET + len(b) * 2 + 2


def test_discord_search_escapes_the_words_around_the_highlights() -> None:
    snippet = "say *this* or `that` _then_ **rollback** ~~now~~"
    page = SearchPage("r", [hit(None, snippet, [])], 1, 5, 1)
    line = db.format_search(page).splitlines()[1]
    assert line.endswith(r"say \*this\* or \`that\` \_then\_ **rollback** \~\~now\~\~")


@pytest.mark.parametrize("bot", [db, sb])
def test_claude_reply_sends_the_context_and_returns_the_text(bot: Any) -> None:
    api = FakeAPI(Outcome.ok("Hello, Ada."))
    client = anthropic.AsyncAnthropic(
        api_key="test-key",
        base_url="https://api.anthropic.com",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(api)),
    )
    ctx = Context(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])

    async def go() -> str:
        try:
            return str(await bot.claude_reply(client, "claude-test")(ctx))
        finally:
            await client.close()

    assert asyncio.run(go()) == "Hello, Ada."
    sent = api.requests[0]
    assert sent["model"] == "claude-test"
    assert sent["system"] == [
        {"type": "text", "text": bot.SYSTEM_PROMPT, "cache_control": {"type": "ephemeral"}}
    ]
    last = sent["messages"][-1]["content"][-1]
    assert last.pop("cache_control") == {"type": "ephemeral"}  # the newest turn, cached
    assert sent["messages"] == ctx.messages


class FlakyNotes:
    """Iterates like AsyncNotifications: Redis is down at first, then `notices`, then
    the iteration ends, as it does once the consumer is closed."""

    def __init__(self, notices: list[Notice]) -> None:
        self.rounds: list[list[Notice] | None] = [None, notices]

    def __aiter__(self) -> AsyncIterator[Notice]:
        return self._listen()

    async def _listen(self) -> AsyncIterator[Notice]:
        batch = self.rounds.pop(0)
        if batch is None:
            raise Unavailable("could not read notifications on Redis: connection refused")
        for n in batch:
            yield n


@pytest.mark.parametrize("bot", [db, sb])
def test_relay_rides_out_a_redis_outage(bot: Any) -> None:
    posted: list[str] = []

    async def post(n: Notice, text: str) -> None:
        posted.append(text)

    notes = FlakyNotes([notice(1, nt.COMMAND_REFUSED, "c", text="no")])
    asyncio.run(bot.relay_notices(notes, AGENT, post, retry_seconds=0))
    assert posted == ["Refused: no"]
    assert notes.rounds == []


def test_config_names_the_missing_variable() -> None:
    with pytest.raises(ConfigError, match="DISCORD_TOKEN is not set"):
        db.Config.from_env({})
    config = db.Config.from_env({"DISCORD_TOKEN": "t", "CONTEXTLOG_AGENT": "beta"})
    assert (config.agent, config.redis_url) == ("beta", "redis://127.0.0.1:6379/0")
    with pytest.raises(ConfigError, match=r"SLACK_APP_TOKEN .* or SLACK_SIGNING_SECRET"):
        sb.Config.from_env({"SLACK_BOT_TOKEN": "xoxb-1"})
    with pytest.raises(ConfigError, match="PORT is not a TCP port"):
        sb.Config.from_env({"SLACK_BOT_TOKEN": "x", "SLACK_SIGNING_SECRET": "s", "PORT": "x"})


# -- Discord --------------------------------------------------------------------------

GUILD, CHANNEL, THREAD, BOT_ID, ADA = 10, 20, 30, 42, 7
ADA_USER = {"id": str(ADA), "username": "ada", "discriminator": "0", "avatar": None}
BOT_USER = {**ADA_USER, "id": str(BOT_ID), "username": "contextbot", "bot": True}
TEXT_CHANNEL = {
    "id": str(CHANNEL),
    "type": 0,  # guild text channel
    "guild_id": str(GUILD),
    "name": "general",
    "position": 0,
    "permission_overwrites": [],
}
THREAD_CHANNEL = {
    "id": str(THREAD),
    "type": 11,  # public thread
    "guild_id": str(GUILD),
    "parent_id": str(CHANNEL),
    "owner_id": str(ADA),
    "name": "weather",
    "message_count": 1,
    "member_count": 1,
    "thread_metadata": {
        "archived": False,
        "auto_archive_duration": 1440,
        "archive_timestamp": "2026-11-22T12:00:00+00:00",
    },
}


def message_payload(
    message_id: int, channel_id: int, author: dict[str, Any], content: str
) -> dict[str, Any]:
    return {
        "id": str(message_id),
        "channel_id": str(channel_id),
        "author": author,
        "content": content,
        "timestamp": "2026-11-22T12:00:00+00:00",
        "edited_timestamp": None,
        "tts": False,
        "mention_everyone": False,
        "mentions": [],
        "mention_roles": [],
        "attachments": [],
        "embeds": [],
        "pinned": False,
        "type": 0,
    }


class FakeDiscordAPI(HTTPClient):
    """Discord's REST API for the routes the bot uses; every call goes through `request`."""

    def __init__(self, loop: Any) -> None:
        super().__init__(loop)
        self.calls: list[tuple[str, str, Any]] = []
        self.sent = Waiter()  # (channel id, content) of each message the bot posted
        self._next_id = 900

    async def request(self, route: Route, **kwargs: Any) -> Any:
        path = route.url.removeprefix(Route.BASE)
        body: Any = kwargs.get("json")
        self.calls.append((route.method, path, body))
        if (route.method, route.path) == ("GET", "/users/@me"):
            return BOT_USER
        if (route.method, route.path) == ("GET", "/oauth2/applications/@me"):
            return {
                "id": "1",
                "name": "contextbot",
                "description": "",
                "icon": None,
                "bot_public": False,
                "bot_require_code_grant": False,
                "owner": ADA_USER,
                "verify_key": "0" * 64,
            }
        if (route.method, route.path) == ("PUT", "/applications/{application_id}/commands"):
            return [{"id": str(i + 100), "application_id": "1", **c} for i, c in enumerate(body)]
        if (route.method, route.path) == ("POST", "/channels/{channel_id}/messages"):
            self._next_id += 1
            channel_id = int(str(route.channel_id))
            self.sent.add((channel_id, body["content"]))
            return message_payload(self._next_id, channel_id, BOT_USER, body["content"])
        raise AssertionError(f"unexpected Discord call {route.method} {path}")


class FakeInteractionAPI(AsyncWebhookAdapter):
    """Interaction callbacks and follow-ups (discord.py sends them through this adapter)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.responses: list[tuple[int, dict[str, Any]]] = []  # (callback type, data)
        self.followups: list[dict[str, Any]] = []

    async def request(self, route: Route, session: Any, **kwargs: Any) -> Any:
        payload = kwargs.get("payload") or {}
        if route.path.endswith("/callback"):
            self.responses.append((payload["type"], payload.get("data", {})))
            return {"interaction": {"id": str(route.webhook_id), "type": 2}}
        self.followups.append(payload)
        return None


class OfflineClient(db.DiscordClient):
    """The example's client with the fake REST API in place of discord.com."""

    def _get_state(self, **options: Any) -> Any:
        # discord.Client.__init__ makes its HTTPClient, then calls this hook (the one
        # AutoShardedClient overrides) to build the ConnectionState around it; the command
        # tree, made after, takes it from the client. No constructor argument takes one.
        self.http = FakeDiscordAPI(self.loop)
        return super()._get_state(**options)

    @property
    def api(self) -> FakeDiscordAPI:
        assert isinstance(self.http, FakeDiscordAPI)
        return self.http


@asynccontextmanager
async def discord_bot(
    server: fakeredis.FakeServer, reader: FakeReader | None = None, *, notes: bool = False
) -> AsyncIterator[tuple[OfflineClient, FakeInteractionAPI]]:
    """A logged-in client (commands synced, notifications relayed when `notes`)."""
    bot = db.ContextBot(producer(server), reader or FakeReader(server), agent=AGENT)  # type: ignore[arg-type]
    consumer = (
        AsyncNotifications(fakeredis.FakeAsyncRedis(server=server), "discord", consumer="bot-1")
        if notes
        else None
    )
    client = OfflineClient(bot, consumer)
    interactions = FakeInteractionAPI()
    token = async_context.set(interactions)
    try:
        async with client:
            await client.login("offline-token")
            yield client, interactions
    finally:
        async_context.reset(token)


def guild(client: discord.Client) -> discord.Guild:
    return discord.Guild(data={"id": str(GUILD), "name": "lab"}, state=client._connection)  # type: ignore[typeddict-item]


def discord_message(
    client: discord.Client,
    content: str,
    *,
    message_id: int = 500,
    author: dict[str, Any] = ADA_USER,
    in_thread: bool = False,
) -> discord.Message:
    state = client._connection
    channel: discord.TextChannel | discord.Thread
    if in_thread:
        channel = discord.Thread(guild=guild(client), state=state, data=THREAD_CHANNEL)  # type: ignore[arg-type]
    else:
        channel = discord.TextChannel(state=state, guild=guild(client), data=TEXT_CHANNEL)  # type: ignore[arg-type]
    data = message_payload(message_id, channel.id, author, content)
    return discord.Message(state=state, channel=channel, data=data)  # type: ignore[arg-type]


def context_interaction(
    client: discord.Client, sub: str, in_thread: bool = False, **options: Any
) -> discord.Interaction[Any]:
    """`/context <sub> [options]` as Discord delivers it (option types as registered)."""
    types = {str: 3, int: 4}
    data = {
        "id": "600",
        "application_id": "1",
        "token": "interaction-token",
        "version": 1,
        "type": 2,  # application command
        "guild_id": str(GUILD),
        "channel": THREAD_CHANNEL if in_thread else TEXT_CHANNEL,
        "channel_id": str(THREAD if in_thread else CHANNEL),
        "member": {
            "user": ADA_USER,
            "roles": [],
            "flags": 0,
            "deaf": False,
            "mute": False,
        },
        "attachment_size_limit": 8 * 1024 * 1024,
        "data": {
            "id": "100",
            "name": "context",
            "type": 1,
            "options": [
                {
                    "type": 1,  # sub-command
                    "name": sub,
                    "options": [
                        {"type": types[type(v)], "name": k, "value": v} for k, v in options.items()
                    ],
                }
            ],
        },
    }
    return discord.Interaction(data=data, state=client._connection)  # type: ignore[arg-type]


async def invoke(client: discord.Client, interaction: discord.Interaction[Any]) -> None:
    """Run an interaction's command as the gateway's INTERACTION_CREATE handler does (it
    wraps `_call` in a task and logs errors; awaited here, errors fail the test)."""
    tree = client._connection._command_tree
    assert tree is not None
    await tree._call(interaction)


def run_discord(
    server: fakeredis.FakeServer,
    body: Callable[[OfflineClient, FakeInteractionAPI], Awaitable[Any]],
    reader: FakeReader | None = None,
    *,
    notes: bool = False,
) -> Any:
    async def go() -> Any:
        async with discord_bot(server, reader, notes=notes) as (client, interactions):
            return await body(client, interactions)

    return asyncio.run(go())


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


def test_discord_login_registers_the_context_commands(server: fakeredis.FakeServer) -> None:
    async def body(client: OfflineClient, _: FakeInteractionAPI) -> Any:
        return client.api.calls

    calls = run_discord(server, body)
    method, path, commands = calls[-1]
    assert (method, path) == ("PUT", "/applications/1/commands")
    (group,) = commands
    assert group["name"] == "context"
    subs = {o["name"]: [p["name"] for p in o.get("options", [])] for o in group["options"]}
    assert subs == {
        "save": ["description"],
        "clear": [],
        "history": ["page"],
        "search": ["query", "page"],
        "restore": ["session"],
        "settings": ["idle", "window", "budget"],
    }


def test_discord_message_is_logged_answered_and_the_answer_logged(
    server: fakeredis.FakeServer,
) -> None:
    reader = FakeReader(server)

    async def body(client: OfflineClient, _: FakeInteractionAPI) -> Any:
        await client.on_message(discord_message(client, "What's the weather in Oslo?"))
        return client.api.sent.items

    sent = run_discord(server, body, reader)
    answer = "(echo) What's the weather in Oslo?  [context: 1 turns, ~7 tokens]"
    assert sent == [(CHANNEL, answer)]
    user, assistant = pushed(server)
    assert isinstance(user, ev.MessagePosted) and isinstance(assistant, ev.MessagePosted)
    assert (user.role, user.content, user.sender, user.source) == (
        "user",
        "What's the weather in Oslo?",
        str(ADA),
        "discord",
    )
    assert (user.agent, user.channel, user.thread, user.external_id) == (
        AGENT,
        str(CHANNEL),
        None,
        "500",
    )
    assert reader.calls == [("context", AGENT, str(CHANNEL), None, str(user.event_id))]
    assert (assistant.role, assistant.content, assistant.sender) == ("assistant", answer, "42")
    assert (assistant.channel, assistant.external_id) == (str(CHANNEL), "901")


def test_discord_thread_message_is_the_parent_channel_with_a_thread(
    server: fakeredis.FakeServer,
) -> None:
    async def body(client: OfflineClient, _: FakeInteractionAPI) -> Any:
        await client.on_message(discord_message(client, "and tomorrow?", in_thread=True))
        return client.api.sent.items

    sent = run_discord(server, body)
    assert [channel for channel, _ in sent] == [THREAD]  # answered in the thread
    user, assistant = pushed(server)
    assert (user.channel, user.thread) == (str(CHANNEL), str(THREAD))
    assert (assistant.channel, assistant.thread) == (str(CHANNEL), str(THREAD))


def test_discord_bot_messages_are_ignored(server: fakeredis.FakeServer) -> None:
    async def body(client: OfflineClient, _: FakeInteractionAPI) -> Any:
        await client.on_message(discord_message(client, "(echo) hi", author=BOT_USER))
        other_bot = {**ADA_USER, "id": "77", "bot": True}
        await client.on_message(discord_message(client, "beep", author=other_bot))
        return client.api.sent.items

    assert run_discord(server, body) == []
    assert pushed(server) == []


def test_discord_long_answer_is_sent_in_pieces_and_logged_whole(
    server: fakeredis.FakeServer,
) -> None:
    async def long_reply(ctx: Context) -> str:
        return "x" * 4500

    async def body(client: OfflineClient, _: FakeInteractionAPI) -> Any:
        client.bot.reply = long_reply
        await client.on_message(discord_message(client, "tell me everything"))
        return client.api.sent.items

    sent = run_discord(server, body)
    assert [len(text) for _, text in sent] == [2000, 2000, 500]
    assistant = pushed(server)[-1]
    assert isinstance(assistant, ev.MessagePosted) and assistant.content == "x" * 4500


@pytest.mark.parametrize(
    ("sub", "options", "expected"),
    [
        ("save", {"description": "weather chat"}, ("save.v1", {"description": "weather chat"})),
        ("save", {}, ("save.v1", {})),
        ("clear", {}, ("clear.v1", {})),
        ("restore", {"session": "last"}, ("restore.v1", {"session_id": "last"})),
        (
            "settings",
            {"idle": "10m", "window": "24h", "budget": 8000},
            (
                "configure.v1",
                {"idle_timeout": 600, "rolling_window": 86400, "token_budget": 8000},
            ),
        ),
    ],
)
def test_discord_context_command_becomes_its_event(
    server: fakeredis.FakeServer,
    sub: str,
    options: dict[str, Any],
    expected: tuple[str, dict[str, Any]],
) -> None:
    async def body(client: OfflineClient, interactions: FakeInteractionAPI) -> Any:
        await invoke(client, context_interaction(client, sub, **options))
        return interactions.responses

    responses = run_discord(server, body)
    tag, fields = expected
    common = {"agent": AGENT, "channel": str(CHANNEL), "source": "discord", "sender": str(ADA)}
    assert without_ids(pushed(server)) == [(tag, common | fields)]
    ((kind, data),) = responses
    assert kind == 4 and "flags" not in data  # a message the channel sees
    assert data["content"]


def test_discord_command_in_a_thread_names_the_thread(server: fakeredis.FakeServer) -> None:
    async def body(client: OfflineClient, _: FakeInteractionAPI) -> Any:
        await invoke(client, context_interaction(client, "save", in_thread=True))

    run_discord(server, body)
    (save,) = pushed(server)
    assert (save.channel, save.thread) == (str(CHANNEL), str(THREAD))


def test_discord_bad_settings_value_is_refused_and_nothing_sent(
    server: fakeredis.FakeServer,
) -> None:
    async def body(client: OfflineClient, interactions: FakeInteractionAPI) -> Any:
        await invoke(client, context_interaction(client, "settings", idle="ten minutes"))
        await invoke(client, context_interaction(client, "settings"))
        return interactions.responses

    responses = run_discord(server, body)
    assert pushed(server) == []
    assert [data["content"] for _, data in responses] == [
        "Not changed: not a duration: 'ten minutes' (use e.g. 90s, 10m, 24h, 7d)",
        "Not changed: give at least one setting: idle (e.g. 30m), window (24h), budget",
    ]
    assert all(data["flags"] == 64 for _, data in responses)  # ephemeral: only Ada sees it


def test_discord_history_is_answered_from_the_read_model(server: fakeredis.FakeServer) -> None:
    reader = FakeReader(server, SessionPage([session("2026-11-22_login-bug")], 2, 5, 6))

    async def body(client: OfflineClient, interactions: FakeInteractionAPI) -> Any:
        await invoke(client, context_interaction(client, "history", page=2))
        return interactions

    interactions = run_discord(server, body, reader)
    assert reader.calls == [("sessions", AGENT, str(CHANNEL), 2, db.PER_PAGE)]
    assert [kind for kind, _ in interactions.responses] == [5]  # deferred, "thinking..."
    (followup,) = interactions.followups
    assert followup["content"].startswith("Saved sessions, page 2 of 2 (6 in all):\n")
    assert "`2026-11-22_login-bug`" in followup["content"]
    assert pushed(server) == []


def test_discord_search_is_answered_from_this_channel_only(
    server: fakeredis.FakeServer,
) -> None:
    page = SearchPage("rollback", [hit(str(ADA), "the **rollback**", ["s1"])], 2, 5, 6)
    reader = FakeReader(server, results=page)

    async def body(client: OfflineClient, interactions: FakeInteractionAPI) -> Any:
        # From a thread: the search covers its channel's conversation, threads and all.
        command = context_interaction(client, "search", True, query="rollback", page=2)
        await invoke(client, command)
        return interactions

    interactions = run_discord(server, body, reader)
    assert reader.calls == [("search", AGENT, "rollback", str(CHANNEL), None, None, 2, db.PER_PAGE)]
    assert [kind for kind, _ in interactions.responses] == [5]  # deferred, "thinking..."
    (followup,) = interactions.followups
    assert followup["content"].splitlines()[:2] == [
        "Messages matching `rollback`, page 2 of 2 (6 found):",
        f"- 2026-11-22 12:05 UTC, user <@{ADA}>: the **rollback**",
    ]
    assert followup["allowed_mentions"] == {"parse": []}  # quoted words ping no one
    assert pushed(server) == []


def test_discord_search_refused_says_why(server: fakeredis.FakeServer) -> None:
    async def body(client: OfflineClient, interactions: FakeInteractionAPI) -> Any:
        await invoke(client, context_interaction(client, "search", query="-draft"))
        await invoke(client, context_interaction(client, "search", query="rollback", page=0))
        return interactions.followups

    followups = run_discord(server, body)
    assert [f["content"] for f in followups] == [
        "No search: the query has no word to look for (only words to leave out): "
        'give a word, a "phrase" or a prefix*',
        "No search: page must be >= 1 and per_page 1..50",
    ]


def test_discord_notifications_are_posted_in_their_channel(
    server: fakeredis.FakeServer,
) -> None:
    publish(
        server,
        "discord",
        notice(1, nt.SUMMARY_READY, "20", session_id="s1", text="We met.", auto=True),
        notice(2, nt.COMMAND_REFUSED, "21", thread="31", text="there is no session 'x'"),
        notice(3, nt.SUMMARY_READY, "99", agent="beta", text="not ours"),
        notice(4, nt.RESTORE_DONE, "22", session_id="s1", text="restored session s1 (4 messages)"),
        notice(5, nt.SESSION_SAVED, "22", session_id="s1", text="saved session s1 (4 messages)"),
        notice(5, nt.SESSION_SAVED, "22", session_id="s1", text="saved session s1 (4 messages)"),
    )

    async def body(client: OfflineClient, _: FakeInteractionAPI) -> Any:
        return await client.api.sent.wait(4)

    sent = run_discord(server, body, notes=True)
    assert sent == [
        (20, "Saved after inactivity: We met.\n(`/context restore s1`)"),
        (31, "Refused: there is no session 'x'"),  # in the thread the command came from
        (22, "Restored session s1 (4 messages)."),
        (22, "Saved session s1 (4 messages)."),  # once, though delivered twice
    ]


# -- Slack ----------------------------------------------------------------------------


class FakeSlack:
    """Slack's Web API (auth.test, chat.postMessage) and response_url, on 127.0.0.1."""

    def __init__(self) -> None:
        self.posted = Waiter()  # chat.postMessage arguments
        self.responded: list[dict[str, Any]] = []  # bodies sent to a response_url
        self.app = web.Application()
        self.app.router.add_post("/api/{method}", self.api)
        self.app.router.add_post("/respond/{id}", self.respond)
        self._ts = 200

    async def api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        if method == "auth.test":
            ids = {"user_id": "UBOT", "bot_id": "BBOT", "team_id": "T1", "user": "contextbot"}
            return web.json_response({"ok": True, **ids})
        if method == "chat.postMessage":
            args = await request.json()
            args.pop("team_id", None)  # the per-request client adds the workspace's
            self.posted.add(args)
            self._ts += 1
            ts = f"1763812800.000{self._ts}"
            return web.json_response({"ok": True, "channel": args["channel"], "ts": ts})
        return web.json_response({"ok": False, "error": "unknown_method"}, status=404)

    async def respond(self, request: web.Request) -> web.Response:
        self.responded.append(await request.json())
        return web.Response(text="ok")


@asynccontextmanager
async def slack_bot(
    server: fakeredis.FakeServer, reader: FakeReader | None = None
) -> AsyncIterator[tuple[AsyncApp, FakeSlack, str]]:
    """The example's app on the fake Slack; yields (app, fake, the fake's base URL)."""
    fake = FakeSlack()
    http = TestServer(fake.app, host="127.0.0.1")
    await http.start_server()
    base = str(http.make_url("/"))
    bot = sb.SlackContextBot(producer(server), reader or FakeReader(server), agent=AGENT)  # type: ignore[arg-type]
    app = sb.build_app(
        bot,
        client=AsyncWebClient(token="xoxb-test", base_url=base + "api/"),
        request_verification_enabled=False,
        # The dispatch returns once the listener is done (bolt's mode for FaaS), so a
        # test needs no wait; in production bolt acks first and runs the listener after.
        process_before_response=True,
    )
    try:
        yield app, fake, base
    finally:
        await http.close()


JSON, FORM = "application/json", "application/x-www-form-urlencoded"


async def dispatch(app: AsyncApp, body: str, content_type: str) -> int:
    response = await app.async_dispatch(
        AsyncBoltRequest(body=body, headers={"content-type": [content_type]})
    )
    return response.status


def message_event(text: str, *, ts: str = "1763812800.000100", **event: Any) -> str:
    payload = {
        "token": "verification-token",
        "team_id": "T1",
        "api_app_id": "A1",
        "type": "event_callback",
        "event_id": "Ev1",
        "event_time": 1763812800,
        "event": {
            "type": "message",
            "channel": "C1",
            "channel_type": "channel",
            "user": "U1",
            "text": text,
            "ts": ts,
            **event,
        },
    }
    return json.dumps(payload)


def slash_command(text: str, base: str) -> str:
    return urlencode(
        {
            "token": "verification-token",
            "team_id": "T1",
            "channel_id": "C1",
            "user_id": "U1",
            "command": "/context",
            "text": text,
            "response_url": base + "respond/1",
            "trigger_id": "1.2.3",
        }
    )


def run_slack(
    server: fakeredis.FakeServer,
    body: Callable[[AsyncApp, FakeSlack, str], Awaitable[Any]],
    reader: FakeReader | None = None,
) -> Any:
    async def go() -> Any:
        async with slack_bot(server, reader) as (app, fake, base):
            return await body(app, fake, base)

    return asyncio.run(go())


def test_slack_message_is_logged_answered_and_the_answer_logged(
    server: fakeredis.FakeServer,
) -> None:
    async def body(app: AsyncApp, fake: FakeSlack, _: str) -> Any:
        status = await dispatch(app, message_event("hello there"), JSON)
        return status, fake.posted.items

    status, posted = run_slack(server, body)
    answer = "(echo) hello there  [context: 1 turns, ~7 tokens]"
    assert status == 200
    assert posted == [{"channel": "C1", "text": answer}]
    user, assistant = pushed(server)
    assert isinstance(user, ev.MessagePosted) and isinstance(assistant, ev.MessagePosted)
    assert (user.channel, user.thread, user.sender, user.source, user.external_id) == (
        "C1",
        None,
        "U1",
        "slack",
        "C1:1763812800.000100",
    )
    assert (assistant.role, assistant.content, assistant.sender, assistant.external_id) == (
        "assistant",
        answer,
        "UBOT",
        "C1:1763812800.000201",
    )


def test_slack_thread_reply_is_answered_in_the_thread(server: fakeredis.FakeServer) -> None:
    async def body(app: AsyncApp, fake: FakeSlack, _: str) -> Any:
        event = message_event("and tomorrow?", thread_ts="1763812700.000001")
        await dispatch(app, event, JSON)
        return fake.posted.items

    (posted,) = run_slack(server, body)
    assert posted["thread_ts"] == "1763812700.000001"
    user, assistant = pushed(server)
    assert (user.channel, user.thread) == ("C1", "1763812700.000001")
    assert assistant.thread == "1763812700.000001"


def test_slack_bot_messages_and_edits_are_ignored(server: fakeredis.FakeServer) -> None:
    async def body(app: AsyncApp, fake: FakeSlack, _: str) -> Any:
        # Our own post (bolt drops it: the bot's ids come from auth.test), another bot's,
        # and an edit.
        await dispatch(app, message_event("(echo) hi", user="UBOT", bot_id="BBOT"), JSON)
        await dispatch(app, message_event("beep", bot_id="B2", subtype="bot_message"), JSON)
        await dispatch(app, message_event("hi!", subtype="message_changed"), JSON)
        return fake.posted.items

    assert run_slack(server, body) == []
    assert pushed(server) == []


@pytest.mark.parametrize(
    ("text", "expected", "reply"),
    [
        (
            "save weather chat",
            ("save.v1", {"description": "weather chat"}),
            "Saving this conversation; its summary follows.",
        ),
        ("clear", ("clear.v1", {}), "Cleared: I start afresh in this channel."),
        ("restore last", ("restore.v1", {"session_id": "last"}), "Restoring `last`..."),
        (
            "settings idle=10m window=24h budget=8000",
            (
                "configure.v1",
                {"idle_timeout": 600, "rolling_window": 86400, "token_budget": 8000},
            ),
            "Settings changed: idle 10m, window 24h, budget 8000.",
        ),
    ],
)
def test_slack_context_command_becomes_its_event(
    server: fakeredis.FakeServer, text: str, expected: tuple[str, dict[str, Any]], reply: str
) -> None:
    async def body(app: AsyncApp, fake: FakeSlack, base: str) -> Any:
        status = await dispatch(app, slash_command(text, base), "application/x-www-form-urlencoded")
        return status, fake.responded

    status, responded = run_slack(server, body)
    tag, fields = expected
    common = {"agent": AGENT, "channel": "C1", "source": "slack", "sender": "U1"}
    assert status == 200
    assert without_ids(pushed(server)) == [(tag, common | fields)]
    assert responded == [{"text": reply, "response_type": "in_channel"}]


@pytest.mark.parametrize(
    ("text", "reply"),
    [
        ("settings idle=soon", "Not done: not a duration: 'soon' (use e.g. 90s, 10m, 24h, 7d)"),
        ("settings budget=0", "Not done: budget must be a number of tokens, 1 to 10000000"),
        ("settings colour=blue", "Not done: unknown setting 'colour=blue'"),
        ("restore", "Usage:"),
        ("", "Usage:"),
        ("search", "Usage:"),
        ("search -draft", "No search: the query has no word to look for"),
        ("search rollback page=two", "No search: the page is a number, not 'two'"),
        ("search rollback page=0", "No search: page must be >= 1"),
    ],
)
def test_slack_bad_command_is_answered_privately_and_nothing_sent(
    server: fakeredis.FakeServer, text: str, reply: str
) -> None:
    async def body(app: AsyncApp, fake: FakeSlack, base: str) -> Any:
        await dispatch(app, slash_command(text, base), FORM)
        return fake.responded

    (responded,) = run_slack(server, body)
    assert responded["text"].startswith(reply)
    assert "response_type" not in responded  # ephemeral: only the user sees it
    assert pushed(server) == []


def test_slack_history_is_answered_from_the_read_model(server: fakeredis.FakeServer) -> None:
    reader = FakeReader(server, SessionPage([session("2026-11-22_login-bug")], 1, 10, 1))

    async def body(app: AsyncApp, fake: FakeSlack, base: str) -> Any:
        await dispatch(app, slash_command("history", base), FORM)
        return fake.responded

    (responded,) = run_slack(server, body, reader)
    assert reader.calls == [("sessions", AGENT, "C1", 1, sb.PER_PAGE)]
    assert responded["text"].splitlines()[:2] == [
        "Saved sessions, page 1 of 1 (1 in all):",
        "- `2026-11-22_login-bug`, 4 messages: login bug",
    ]
    assert pushed(server) == []


def test_slack_search_is_answered_privately_from_this_channel_only(
    server: fakeredis.FakeServer,
) -> None:
    page = SearchPage("rollback plan", [hit("U1", "the **rollback** plan", ["s1"])], 2, 10, 11)
    reader = FakeReader(server, results=page)

    async def body(app: AsyncApp, fake: FakeSlack, base: str) -> Any:
        await dispatch(app, slash_command("search rollback plan page=2", base), FORM)
        return fake.responded

    (responded,) = run_slack(server, body, reader)
    assert reader.calls == [("search", AGENT, "rollback plan", "C1", None, None, 2, sb.PER_PAGE)]
    assert responded["text"].splitlines() == [
        "Messages matching `rollback plan`, page 2 of 2 (11 found):",
        "- 2026-11-22 12:05 UTC, user <@U1>: the *rollback* plan",
        "  in `s1`",
        "`/context restore <id>` brings a session back.",
    ]
    assert "response_type" not in responded  # ephemeral: the query is the user's own
    assert pushed(server) == []


def test_slack_notifications_are_posted_in_their_channel(server: fakeredis.FakeServer) -> None:
    publish(
        server,
        "slack",
        notice(1, nt.SUMMARY_READY, "C1", session_id="s1", text="We met.", auto=True),
        notice(2, nt.COMMAND_REFUSED, "C2", thread="1763812700.000001", text="no such session"),
        notice(3, nt.SUMMARY_READY, "C9", agent="beta", text="not ours"),
    )

    async def body(app: AsyncApp, fake: FakeSlack, _: str) -> Any:
        notes = AsyncNotifications(fakeredis.FakeAsyncRedis(server=server), "slack")
        relay = asyncio.create_task(sb.relay_notices(notes, AGENT, sb.poster(app.client)))
        try:
            return await fake.posted.wait(2)
        finally:
            await notes.aclose()  # as main() stops it: the relay's loop ends
            await asyncio.wait_for(relay, 5)

    assert run_slack(server, body) == [
        {"channel": "C1", "text": "Saved after inactivity: We met.\n(`/context restore s1`)"},
        {"channel": "C2", "text": "Refused: no such session", "thread_ts": "1763812700.000001"},
    ]
