"""A slack-bolt (asyncio) bot with contextlog memory: an example adapter on `producers`.

Every channel message (not a bot's) is posted as a user event, the bot answers with the
context `AsyncContextReader` returns and posts its answer as the assistant's message.
`/context save|clear|restore|settings` map to producer commands, `/context history` and
`/context search <query>` (this channel's messages that match) are answered from the
read model, and the adapter's notifications (saves, summaries, refusals) are posted back
with `chat.postMessage`.

    SLACK_BOT_TOKEN=xoxb-... SLACK_APP_TOKEN=xapp-... python -m examples.slack_bot
    SLACK_BOT_TOKEN=xoxb-... SLACK_SIGNING_SECRET=... PORT=3000 python -m examples.slack_bot

With SLACK_APP_TOKEN the bot connects in Socket Mode; otherwise it serves the Events API
and the slash command on http://0.0.0.0:$PORT/slack/events. A conversation is
(agent, channel id); a reply in a thread carries the thread's `thread_ts` as its thread.
Each example is self-contained, so the Discord one repeats the few helpers this one has.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import re
import sys
import textwrap
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncBoltContext, AsyncRespond, AsyncSay
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from contextlog.producers import (
    AsyncContextReader,
    AsyncNotifications,
    AsyncProducer,
    ConfigError,
    Context,
    ContextlogError,
    Notice,
    SessionPage,
    Unavailable,
)
from contextlog.producers import notices as nt
from contextlog.producers.commands import parse_duration
from contextlog.producers.search import SearchHit, SearchPage
from contextlog.schema.events import MAX_DURATION_S, MAX_TOKEN_BUDGET

SOURCE = "slack"
MAX_MESSAGE = 4000  # Slack truncates a message's text beyond this
PER_PAGE = 10  # sessions per history page, hits per search page
SNIPPET = 200  # characters of a hit's words shown: ten hits and their sessions fit
HELP = """Usage:
`/context save [description]` save this conversation as a session
`/context clear` start afresh (the log keeps everything)
`/context history [page]` saved sessions, newest first
`/context search <query> [page=N]` this channel's messages with these words
    (and `"a phrase"`, a prefix `roll*`, `-draft` to leave out, `this OR that`)
`/context restore <id|last>` bring a saved session back
`/context settings idle=30m window=24h budget=16000` change this channel's settings"""
# Messages of these subtypes are people talking; every other subtype is an edit, a
# join, a bot's post...
PEOPLE = frozenset({None, "thread_broadcast", "file_share"})
USER_ID = re.compile(r"[UW][A-Z0-9]+")  # a Slack user's id (a bot user's too)
log = logging.getLogger("contextlog.examples.slack")

Reply = Callable[[Context], Awaitable[str]]


# -- the model ------------------------------------------------------------------------


def last_user_text(ctx: Context) -> str:
    """The text of the context's last user turn (what the model is answering)."""
    for message in reversed(ctx.messages):
        if message["role"] == "user":
            return " ".join(b["text"] for b in message["content"] if b.get("type") == "text")
    return ""


async def echo_reply(ctx: Context) -> str:
    """The offline model: says what it got and how much context it saw."""
    turns = len(ctx.messages)
    return f"(echo) {last_user_text(ctx)}  [context: {turns} turns, ~{ctx.token_estimate} tokens]"


SYSTEM_PROMPT = "You are a helpful assistant in a Slack workspace. Answer briefly."


def claude_reply(
    client: Any, model: str, max_tokens: int = 1024, *, system: str = SYSTEM_PROMPT
) -> Reply:
    """Replies from the Messages API (`anthropic.AsyncAnthropic`) with the context, the
    bot's own system prompt ahead of ours, and prompt-cache breakpoints."""

    async def reply(ctx: Context) -> str:
        answer = await client.messages.create(
            model=model, max_tokens=max_tokens, **ctx.to_anthropic(system=system, cache=True)
        )
        return "".join(b.text for b in answer.content if b.type == "text")

    return reply


# -- pure helpers ---------------------------------------------------------------------

_SETTINGS = ("idle", "window", "budget")


def parse_settings(
    idle: str | None, window: str | None, budget: int | str | None
) -> dict[str, int]:
    """`configure` keyword arguments from user input; ValueError says what was wrong."""
    changes: dict[str, int] = {}
    for name, key, raw, lowest in (
        ("idle", "idle_timeout", idle, 0),
        ("window", "rolling_window", window, 1),
    ):
        if raw is None:
            continue
        seconds = parse_duration(raw)
        if not lowest <= seconds <= MAX_DURATION_S:
            raise ValueError(f"{name} must be between {lowest}s and 366d, not {raw!r}")
        changes[key] = seconds
    if budget is not None:
        if not str(budget).strip().isdigit() or not 1 <= int(budget) <= MAX_TOKEN_BUDGET:
            raise ValueError(f"budget must be a number of tokens, 1 to 10000000, not {budget!r}")
        changes["token_budget"] = int(budget)
    if not changes:
        raise ValueError("give at least one setting: idle (e.g. 30m), window (24h), budget")
    return changes


def parse_pairs(words: list[str]) -> dict[str, str]:
    """`idle=10m window=24h` as {"idle": "10m", "window": "24h"}."""
    given: dict[str, str] = {}
    for word in words:
        name, _, value = word.partition("=")
        if name not in _SETTINGS or not value:
            raise ValueError(f"unknown setting {word!r} (use idle=, window=, budget=)")
        given[name] = value
    return given


def format_history(page: SessionPage) -> str:
    """One page of saved sessions as a message."""
    if page.total == 0:
        return "No saved sessions yet: `/context save [description]` saves one."
    if not page.sessions:
        return f"There is no page {page.page}: the history has {page.pages}."
    lines = [f"Saved sessions, page {page.page} of {page.pages} ({page.total} in all):"]
    for s in page:
        auto = " (auto-saved)" if s.auto else ""
        what = textwrap.shorten(s.description or s.preview, 80)
        summary = s.summary if s.summary is not None else "(summary pending)"
        lines.append(f"- `{s.session_id}`{auto}, {s.message_count} messages: {what}")
        lines.append(f"  {textwrap.shorten(summary, 200)}")
    return "\n".join(lines)


def parse_search(words: list[str]) -> tuple[str, int]:
    """`rollback plan page=2` as ("rollback plan", 2): a last word page=N picks the page."""
    *query, last = words
    if not last.startswith("page="):
        return " ".join(words), 1
    number = last.removeprefix("page=")
    if not number.isdigit():
        raise ValueError(f"the page is a number, not {number!r}")
    return " ".join(query), int(number)


def highlighted(snippet: str) -> str:
    """A hit's words in Slack markup: the matches (between ** and **) bold."""
    cut = textwrap.shorten(snippet, SNIPPET, placeholder="")
    parts = cut.split("**")
    text = "".join(f"*{p}*" if i % 2 and p else p for i, p in enumerate(parts))
    return text if cut == snippet else f"{text} …"


def who(hit: SearchHit) -> str:
    """Who said a hit: its role, and its sender as a mention (Slack shows the name)."""
    if hit.sender is None:
        return hit.role
    if USER_ID.fullmatch(hit.sender):
        return f"{hit.role} <@{hit.sender}>"
    return f"{hit.role} {hit.sender}"


def format_search(page: SearchPage) -> str:
    """One page of search hits as a message: when, who, the words found in bold, and the
    saved sessions that hold each (`/context restore <id>` brings one back)."""
    query = f"`{page.query.replace('`', '')}`"
    if page.total == 0:
        return f"No message in this channel matches {query}."
    if not page.hits:
        return f"There is no page {page.page}: the search has {page.pages}."
    found = f"{page.total}+" if page.capped else page.total
    lines = [f"Messages matching {query}, page {page.page} of {page.pages} ({found} found):"]
    for hit in page:
        at = hit.occurred_at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M")
        lines.append(f"- {at} UTC, {who(hit)}: {highlighted(hit.snippet)}")
        saved = ", ".join(f"`{s}`" for s in hit.sessions)
        lines.append(f"  in {saved}" if saved else "  in no saved session")
    if any(hit.sessions for hit in page):
        lines.append("`/context restore <id>` brings a session back.")
    return "\n".join(lines)


def describe(n: Notice) -> str | None:
    """The line to post for a notification, or None for one not worth a message."""
    if n.kind == nt.SUMMARY_READY:
        if n.auto:
            return f"Saved after inactivity: {n.text}\n(`/context restore {n.session_id}`)"
        return f"Summary of `{n.session_id}`: {n.text}"
    if n.kind == nt.COMMAND_REFUSED:
        return f"Refused: {n.text}"
    if n.kind == nt.SESSION_SAVED and n.auto:
        return None  # its summary_ready says it, with the summary
    if n.kind in (nt.SESSION_SAVED, nt.RESTORE_DONE, nt.SESSION_DELETED, nt.SESSIONS_PURGED):
        text = n.text or n.kind
        return text[:1].upper() + text[1:] + "."
    return None  # compactions, and kinds newer than this bot


def chunks(text: str, size: int = MAX_MESSAGE) -> list[str]:
    """`text` in pieces Slack shows whole (never an empty message)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or ["(no answer)"]


class Recent:
    """The last `size` notice ids: delivery is at least once, a bot posts each once."""

    def __init__(self, size: int = 1000) -> None:
        self.size = size
        self._ids: OrderedDict[str, None] = OrderedDict()

    def first_time(self, notice_id: str) -> bool:
        """Whether `notice_id` is new (and remember it)."""
        if notice_id in self._ids:
            return False
        self._ids[notice_id] = None
        if len(self._ids) > self.size:
            self._ids.popitem(last=False)
        return True


# -- the adapter ----------------------------------------------------------------------


class SlackContextBot:
    """Slack events and slash commands in, producer calls and replies out."""

    def __init__(
        self,
        producer: AsyncProducer,
        reader: AsyncContextReader,
        *,
        agent: str,
        reply: Reply = echo_reply,
    ) -> None:
        self.producer, self.reader = producer, reader
        self.agent = agent
        self.reply = reply

    async def on_message(
        self, event: dict[str, Any], say: AsyncSay, context: AsyncBoltContext
    ) -> None:
        """A person's message: log it, answer with the context, log the answer."""
        if event.get("bot_id") or event.get("subtype") not in PEOPLE or not event.get("text"):
            return  # bots (this one too), edits, joins; files without a comment
        channel, thread = event["channel"], event.get("thread_ts")
        try:
            eid = await self.producer.post_message(
                self.agent,
                channel,
                "user",
                event["text"],
                thread=thread,
                sender=event.get("user"),
                source=SOURCE,
                external_id=f"{channel}:{event['ts']}",  # ts is unique per channel only
            )
            ctx = await self.reader.context(self.agent, channel, thread, wait_for=eid, timeout=5)
        except ContextlogError as e:
            await say(text=f"(memory unavailable: {e})", thread_ts=thread)
            return
        answer = await self.reply(ctx) or "(no answer)"
        sent = [await say(text=part, thread_ts=thread) for part in chunks(answer)]
        await self.producer.post_message(
            self.agent,
            channel,
            "assistant",
            answer,
            thread=thread,
            sender=context.bot_user_id,
            source=SOURCE,
            external_id=f"{channel}:{sent[0]['ts']}",
        )

    async def on_command(
        self, ack: AsyncAck, command: dict[str, Any], respond: AsyncRespond
    ) -> None:
        """`/context <verb> ...`: acknowledged at once, answered through `respond`."""
        await ack()
        verb, *rest = command.get("text", "").split() or ["help"]
        try:
            text, visible = await self.run(verb, rest, command["channel_id"], command["user_id"])
        except (ContextlogError, ValueError) as e:
            text, visible = f"Not done: {e}", False
        await respond(text=text[:MAX_MESSAGE], response_type="in_channel" if visible else None)

    async def run(self, verb: str, rest: list[str], channel: str, sender: str) -> tuple[str, bool]:
        """Do one sub-command; the answer, and whether the whole channel should see it."""
        key = (self.agent, channel)
        opts: dict[str, Any] = {"source": SOURCE, "sender": sender}
        if verb == "save":
            await self.producer.save(*key, " ".join(rest) or None, **opts)
            return "Saving this conversation; its summary follows.", True
        if verb == "clear":
            await self.producer.clear(*key, **opts)
            return "Cleared: I start afresh in this channel.", True
        if verb == "history" and len(rest) <= 1:
            if rest and not rest[0].isdigit():
                raise ValueError(f"the page is a number, not {rest[0]!r}")
            page = int(rest[0]) if rest else 1
            found = await self.reader.sessions(*key, page=page, per_page=PER_PAGE)
            return format_history(found), False
        if verb == "search" and rest:
            return await self.search(channel, rest), False
        if verb == "restore" and len(rest) == 1:
            await self.producer.restore(*key, rest[0], **opts)
            return f"Restoring `{rest[0]}`...", True
        if verb == "settings" and rest:
            given = parse_pairs(rest)
            changes = parse_settings(given.get("idle"), given.get("window"), given.get("budget"))
            await self.producer.configure(
                *key,
                idle_timeout=changes.get("idle_timeout"),
                rolling_window=changes.get("rolling_window"),
                token_budget=changes.get("token_budget"),
                **opts,
            )
            text = ", ".join(f"{k} {v}" for k, v in given.items())
            return f"Settings changed: {text}.", True
        return HELP, False

    async def search(self, channel: str, words: list[str]) -> str:
        """`/context search <query> [page=N]`: this channel's messages only, never another's."""
        try:
            query, page = parse_search(words)
            found = await self.reader.search(
                self.agent, query, channel=channel, page=page, per_page=PER_PAGE
            )
        except (ContextlogError, ValueError) as e:
            return "No search: " + str(e).removeprefix("search: ")  # a Refused names its call
        return format_search(found)


def build_app(bot: SlackContextBot, **options: Any) -> AsyncApp:
    """The bolt app: `message` events and `/context` go to `bot`."""
    app = AsyncApp(**options)

    @app.event("message")
    async def message(event: dict[str, Any], say: AsyncSay, context: AsyncBoltContext) -> None:
        await bot.on_message(event, say, context)

    @app.command("/context")
    async def command(ack: AsyncAck, command: dict[str, Any], respond: AsyncRespond) -> None:
        await bot.on_command(ack, command, respond)

    return app


# -- notifications --------------------------------------------------------------------

Post = Callable[[Notice, str], Awaitable[None]]


async def deliver(n: Notice, agent: str, post: Post, recent: Recent) -> bool:
    """Post one notice of this agent's conversations; True if something was posted."""
    text = describe(n) if n.agent == agent else None
    if text is None or not recent.first_time(n.notice_id):
        return False
    await post(n, text[:MAX_MESSAGE])
    return True


def poster(client: AsyncWebClient) -> Post:
    """Posts a notice's line in its channel (and thread) with `chat.postMessage`."""

    async def post(n: Notice, text: str) -> None:
        await client.chat_postMessage(channel=n.channel, text=text, thread_ts=n.thread)

    return post


async def relay_notices(
    notes: AsyncNotifications, agent: str, post: Post, *, retry_seconds: float = 5.0
) -> None:
    """Post notifications as they arrive (each is acked once handled), riding out Redis
    outages, until `notes` is closed or the task is cancelled."""
    recent = Recent()
    while True:
        try:
            async for n in notes:
                try:
                    await deliver(n, agent, post, recent)
                except SlackApiError as e:  # not in the channel any more, archived: move on
                    error = e.response.get("error")
                    log.warning("could not post notice %s: %s", n.notice_id, error)
            return  # `notes` was closed
        except Unavailable as e:  # unacked notices come again once Redis is back
            log.warning("notifications unavailable, retrying in %ss: %s", retry_seconds, e)
            await asyncio.sleep(retry_seconds)


# -- main -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """What the bot reads from the environment, checked at start-up."""

    bot_token: str
    app_token: str | None = None  # Socket Mode
    signing_secret: str | None = None  # HTTP mode
    port: int = 3000
    redis_url: str = "redis://127.0.0.1:6379/0"
    database_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    replica_url: str | None = None  # a streaming replica for context reads
    agent: str = "assistant"
    anthropic_api_key: str | None = None
    model: str = "claude-haiku-4-5"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config:
        """SLACK_BOT_TOKEN, and SLACK_APP_TOKEN or SLACK_SIGNING_SECRET (+ PORT); REDIS_URL,
        DATABASE_URL, CONTEXTLOG_REPLICA_URL, CONTEXTLOG_AGENT, ANTHROPIC_API_KEY,
        ANTHROPIC_MODEL."""
        token = env.get("SLACK_BOT_TOKEN", "").strip()
        if not token:
            raise ConfigError("SLACK_BOT_TOKEN is not set: give the bot token (xoxb-...)")
        app_token = env.get("SLACK_APP_TOKEN", "").strip() or None
        secret = env.get("SLACK_SIGNING_SECRET", "").strip() or None
        if app_token is None and secret is None:
            raise ConfigError(
                "set SLACK_APP_TOKEN (Socket Mode) or SLACK_SIGNING_SECRET (HTTP mode)"
            )
        port = env.get("PORT", "").strip() or str(cls.port)
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"PORT is not a TCP port: {port!r}")
        return cls(
            bot_token=token,
            app_token=app_token,
            signing_secret=secret,
            port=int(port),
            redis_url=env.get("REDIS_URL") or cls.redis_url,
            database_url=env.get("DATABASE_URL") or cls.database_url,
            replica_url=env.get("CONTEXTLOG_REPLICA_URL") or None,
            agent=env.get("CONTEXTLOG_AGENT") or cls.agent,
            anthropic_api_key=env.get("ANTHROPIC_API_KEY") or None,
            model=env.get("ANTHROPIC_MODEL") or cls.model,
        )


def model_for(config: Config) -> Reply:
    """Claude when ANTHROPIC_API_KEY is set, else the echo model."""
    if not config.anthropic_api_key:
        return echo_reply
    import anthropic

    return claude_reply(anthropic.AsyncAnthropic(api_key=config.anthropic_api_key), config.model)


async def serve(app: AsyncApp, config: Config) -> None:
    """Receive Slack's requests: over Socket Mode, or on an HTTP port; until cancelled."""
    if config.app_token:
        from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

        handler = AsyncSocketModeHandler(app, config.app_token)
        await handler.start_async()  # type: ignore[no-untyped-call]  # slack-bolt 1.30
        return
    runner = web.AppRunner(app.web_app(port=config.port))
    await runner.setup()
    try:
        await web.TCPSite(runner, "0.0.0.0", config.port).start()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


async def run(config: Config) -> None:
    """Run the bot until it is stopped; every connection is closed on the way out."""
    producer = AsyncProducer.from_url(config.redis_url)
    reader = AsyncContextReader.from_url(config.database_url, replica_url=config.replica_url)
    notes = AsyncNotifications.from_url(config.redis_url, SOURCE, group=f"slack-{config.agent}")
    bot = SlackContextBot(producer, reader, agent=config.agent, reply=model_for(config))
    app = build_app(bot, token=config.bot_token, signing_secret=config.signing_secret)
    relay = asyncio.create_task(relay_notices(notes, config.agent, poster(app.client)))
    try:
        await serve(app, config)
    finally:
        await notes.aclose()  # ends the relay's loop
        await asyncio.wait({relay}, timeout=5)
        relay.cancel()  # if it is still posting after that
        await reader.aclose()
        await producer.aclose()


def main() -> None:
    """Entry point: configuration from the environment, then the bot."""
    try:
        config = Config.from_env(os.environ)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(level=logging.INFO)
    asyncio.run(run(config))


if __name__ == "__main__":
    main()
