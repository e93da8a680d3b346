"""A discord.py bot with contextlog memory: an example adapter on `producers`.

Every channel message (not a bot's) is posted as a user event, the bot answers with the
context `AsyncContextReader` returns and posts its answer as the assistant's message.
`/context save|clear|restore|settings` map to producer commands, `/context history` and
`/context search <query>` (this channel's messages that match) are answered from the
read model, and the adapter's notifications (saves, summaries, refusals) are posted back
in their channel.

    DISCORD_TOKEN=... REDIS_URL=... DATABASE_URL=... python -m examples.discord_bot

A conversation is (agent, channel id); a message in a thread belongs to the thread's
parent channel, with the thread id as its thread. Each example is self-contained, so
the Slack one repeats the few helpers this one has.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import sys
import textwrap
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import discord
from discord import app_commands

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

SOURCE = "discord"
MAX_MESSAGE = 2000  # Discord's limit on one message's content
PER_PAGE = 5  # sessions per history page, hits per search page: five fit one message
SNIPPET = 160  # characters of a hit's words shown: five hits and their sessions fit too
# Search hits quote anyone's words: an @everyone among them must not ping the channel.
NO_MENTIONS = discord.AllowedMentions.none()
log = logging.getLogger("contextlog.examples.discord")

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


SYSTEM_PROMPT = "You are a helpful assistant in a Discord server. Answer briefly."


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


def highlighted(snippet: str) -> str:
    """A hit's words in Discord markdown: the matches (between ** and **) bold, the rest
    escaped, since a fragment cut mid-markup would restyle the whole reply."""
    cut = textwrap.shorten(snippet, SNIPPET, placeholder="")
    parts = [discord.utils.escape_markdown(part) for part in cut.split("**")]
    text = "".join(f"**{p}**" if i % 2 and p else p for i, p in enumerate(parts))
    return text if cut == snippet else f"{text} …"


def who(hit: SearchHit) -> str:
    """Who said a hit: its role, and its sender as a mention (Discord shows the name)."""
    if hit.sender is None:
        return hit.role
    if hit.sender.isdigit():  # a Discord user id
        return f"{hit.role} <@{hit.sender}>"
    return f"{hit.role} {discord.utils.escape_markdown(hit.sender)}"


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
    """`text` in pieces Discord accepts (never an empty message)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or ["(no answer)"]


def where(channel: Any) -> tuple[str, str | None]:
    """The conversation channel key and thread of a Discord channel."""
    if isinstance(channel, discord.Thread):
        return str(channel.parent_id), str(channel.id)
    return str(channel.id), None


def interaction_where(interaction: discord.Interaction) -> tuple[str, str | None]:
    """The conversation an app command was used in."""
    if interaction.channel is None:  # not resolved: a channel of no type this version knows
        return str(interaction.channel_id), None
    return where(interaction.channel)


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


class ContextBot:
    """Discord messages and interactions in, producer calls and replies out."""

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

    async def on_message(self, message: discord.Message) -> None:
        """A person's message: log it, answer with the context, log the answer."""
        if message.author.bot or not message.content:
            return  # our own replies, other bots, webhooks; attachments alone
        if message.type not in (discord.MessageType.default, discord.MessageType.reply):
            return  # joins, pins and other system messages
        channel, thread = where(message.channel)
        try:
            eid = await self.producer.post_message(
                self.agent,
                channel,
                "user",
                message.content,
                thread=thread,
                sender=str(message.author.id),
                source=SOURCE,
                external_id=str(message.id),
            )
            ctx = await self.reader.context(self.agent, channel, thread, wait_for=eid, timeout=5)
        except ContextlogError as e:
            await message.channel.send(f"(memory unavailable: {e})"[:MAX_MESSAGE])
            return
        answer = await self.reply(ctx) or "(no answer)"
        sent = [await message.channel.send(part) for part in chunks(answer)]
        await self.producer.post_message(
            self.agent,
            channel,
            "assistant",
            answer,
            thread=thread,
            sender=str(sent[0].author.id),
            source=SOURCE,
            external_id=str(sent[0].id),
        )

    async def save(self, interaction: discord.Interaction, description: str | None) -> None:
        """`/context save [description]`."""
        done = "Saving this conversation; its summary follows."
        await self._command(interaction, done, self.producer.save, description)

    async def clear(self, interaction: discord.Interaction) -> None:
        """`/context clear`."""
        done = "Cleared: I start afresh in this channel."
        await self._command(interaction, done, self.producer.clear)

    async def restore(self, interaction: discord.Interaction, session: str) -> None:
        """`/context restore <id|last>`."""
        done = f"Restoring `{session}`..."
        await self._command(interaction, done, self.producer.restore, session)

    async def settings(
        self,
        interaction: discord.Interaction,
        idle: str | None,
        window: str | None,
        budget: int | None,
    ) -> None:
        """`/context settings [idle] [window] [budget]`: nothing is sent unless all parse."""
        try:
            changes = parse_settings(idle, window, budget)
        except ValueError as e:
            await interaction.response.send_message(f"Not changed: {e}", ephemeral=True)
            return
        given = {"idle": idle, "window": window, "budget": budget}
        text = ", ".join(f"{k} {v}" for k, v in given.items() if v is not None)
        done = f"Settings changed: {text}."
        await self._command(interaction, done, self.producer.configure, **changes)

    async def history(self, interaction: discord.Interaction, page: int) -> None:
        """`/context history [page]`, answered from the read model."""
        channel, _ = interaction_where(interaction)
        # Deferred: the first read opens the Postgres pool, which may outlast the 3 s
        # Discord gives an interaction for its first response.
        await interaction.response.defer(thinking=True)
        try:
            found = await self.reader.sessions(self.agent, channel, page=page, per_page=PER_PAGE)
        except (ContextlogError, ValueError) as e:
            await interaction.followup.send(f"No history: {e}")
            return
        await interaction.followup.send(format_history(found)[:MAX_MESSAGE])

    async def search(self, interaction: discord.Interaction, query: str, page: int) -> None:
        """`/context search <query> [page]`: this channel's messages only, never another's."""
        channel, _ = interaction_where(interaction)
        await interaction.response.defer(thinking=True)  # as history's: the pool may be slow
        try:
            found = await self.reader.search(
                self.agent, query, channel=channel, page=page, per_page=PER_PAGE
            )
        except (ContextlogError, ValueError) as e:
            text = "No search: " + str(e).removeprefix("search: ")  # a Refused names its call
        else:
            text = format_search(found)
        await interaction.followup.send(text[:MAX_MESSAGE], allowed_mentions=NO_MENTIONS)

    async def _command(
        self,
        interaction: discord.Interaction,
        done: str,
        call: Callable[..., Awaitable[str]],
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """Push one command event; the person sees `done`, or why it was not sent."""
        channel, thread = interaction_where(interaction)
        sender = str(interaction.user.id)
        try:
            await call(
                self.agent, channel, *args, thread=thread, source=SOURCE, sender=sender, **kwargs
            )
        except ContextlogError as e:
            await interaction.response.send_message(f"Not done: {e}", ephemeral=True)
            return
        await interaction.response.send_message(done)


class ContextCommands(app_commands.Group):
    """The `/context` command group; each sub-command hands over to `ContextBot`."""

    def __init__(self, bot: ContextBot) -> None:
        super().__init__(name="context", description="This channel's conversation memory")
        self.bot = bot

    @app_commands.command(description="Save this conversation as a session")
    @app_commands.describe(description="What it was about (names the session)")
    async def save(self, interaction: discord.Interaction, description: str | None = None) -> None:
        await self.bot.save(interaction, description)

    @app_commands.command(description="Start afresh (the log keeps everything)")
    async def clear(self, interaction: discord.Interaction) -> None:
        await self.bot.clear(interaction)

    @app_commands.command(description="Saved sessions, newest first")
    @app_commands.describe(page="Page number, from 1")
    async def history(self, interaction: discord.Interaction, page: int = 1) -> None:
        await self.bot.history(interaction, page)

    @app_commands.command(description="This channel's messages that match a query")
    @app_commands.describe(
        query='Words, a "phrase", a prefix*, -a word to leave out, this OR that',
        page="Page number, from 1",
    )
    async def search(self, interaction: discord.Interaction, query: str, page: int = 1) -> None:
        await self.bot.search(interaction, query, page)

    @app_commands.command(description="Bring a saved session back")
    @app_commands.describe(session="A session id from /context history, or last")
    async def restore(self, interaction: discord.Interaction, session: str) -> None:
        await self.bot.restore(interaction, session)

    @app_commands.command(description="Idle timeout, rolling window, token budget")
    @app_commands.describe(
        idle="Auto-save after this much silence: 30m, 2h (0 turns it off)",
        window="How far back the context reaches: 24h, 7d",
        budget="Tokens the context may hold",
    )
    async def settings(
        self,
        interaction: discord.Interaction,
        idle: str | None = None,
        window: str | None = None,
        budget: int | None = None,
    ) -> None:
        await self.bot.settings(interaction, idle, window, budget)


# -- notifications --------------------------------------------------------------------

Post = Callable[[Notice, str], Awaitable[None]]


async def deliver(n: Notice, agent: str, post: Post, recent: Recent) -> bool:
    """Post one notice of this agent's conversations; True if something was posted."""
    text = describe(n) if n.agent == agent else None
    if text is None or not recent.first_time(n.notice_id):
        return False
    await post(n, text[:MAX_MESSAGE])
    return True


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
                except discord.HTTPException as e:  # a deleted channel, lost permissions: move on
                    log.warning("could not post notice %s: %s", n.notice_id, e)
            return  # `notes` was closed
        except Unavailable as e:  # unacked notices come again once Redis is back
            log.warning("notifications unavailable, retrying in %ss: %s", retry_seconds, e)
            await asyncio.sleep(retry_seconds)


# -- the client -----------------------------------------------------------------------


class DiscordClient(discord.Client):
    """The discord.py client: messages and `/context` go to `ContextBot`; notifications
    from `notes` are posted while it runs, and `notes` is closed with it."""

    def __init__(
        self,
        bot: ContextBot,
        notes: AsyncNotifications | None = None,
        *,
        guild_id: int | None = None,
        **options: Any,
    ) -> None:
        intents = discord.Intents.default()
        intents.message_content = True  # a privileged intent: enable it in the portal
        super().__init__(intents=intents, **options)
        self.bot, self.notes, self.guild_id = bot, notes, guild_id
        self.tree = app_commands.CommandTree(self)
        self.tree.add_command(ContextCommands(bot))
        self.relay: asyncio.Task[None] | None = None

    async def setup_hook(self) -> None:
        """Register `/context` and start relaying notifications (runs once, at login)."""
        # Syncing at every start is the simplest thing; Discord rate-limits it, so a bot
        # restarted often would sync from an owner's command instead.
        if self.guild_id is not None:  # a guild's commands appear at once, global ones later
            guild = discord.Object(self.guild_id)
            self.tree.copy_global_to(guild=guild)
            await self.tree.sync(guild=guild)
        else:
            await self.tree.sync()
        if self.notes is not None:
            self.relay = asyncio.create_task(relay_notices(self.notes, self.bot.agent, self.post))

    async def on_message(self, message: discord.Message) -> None:
        await self.bot.on_message(message)

    async def post(self, n: Notice, text: str) -> None:
        """Send `text` to the channel (or thread) a notice names, without fetching it."""
        if not (n.thread or n.channel).isdigit():
            log.warning("notice %s names no Discord channel: %r", n.notice_id, n.channel)
            return
        await self.get_partial_messageable(int(n.thread or n.channel)).send(text)

    async def close(self) -> None:
        """Stop the relay (closing `notes` ends its loop), then disconnect."""
        if self.notes is not None:
            await self.notes.aclose()
        if self.relay is not None:
            await asyncio.wait({self.relay}, timeout=5)
            self.relay.cancel()  # if it is still posting after that
        await super().close()


# -- main -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """What the bot reads from the environment, checked at start-up."""

    discord_token: str
    redis_url: str = "redis://127.0.0.1:6379/0"
    database_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    replica_url: str | None = None  # a streaming replica for context reads
    agent: str = "assistant"
    guild_id: int | None = None
    anthropic_api_key: str | None = None
    model: str = "claude-haiku-4-5"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config:
        """DISCORD_TOKEN (required), REDIS_URL, DATABASE_URL, CONTEXTLOG_REPLICA_URL,
        CONTEXTLOG_AGENT, DISCORD_GUILD_ID, ANTHROPIC_API_KEY, ANTHROPIC_MODEL."""
        token = env.get("DISCORD_TOKEN", "").strip()
        if not token:
            raise ConfigError("DISCORD_TOKEN is not set: give the bot token of your app")
        guild = env.get("DISCORD_GUILD_ID", "").strip()
        if guild and not guild.isdigit():
            raise ConfigError(f"DISCORD_GUILD_ID is not a Discord id: {guild!r}")
        return cls(
            discord_token=token,
            redis_url=env.get("REDIS_URL") or cls.redis_url,
            database_url=env.get("DATABASE_URL") or cls.database_url,
            replica_url=env.get("CONTEXTLOG_REPLICA_URL") or None,
            agent=env.get("CONTEXTLOG_AGENT") or cls.agent,
            guild_id=int(guild) if guild else None,
            anthropic_api_key=env.get("ANTHROPIC_API_KEY") or None,
            model=env.get("ANTHROPIC_MODEL") or cls.model,
        )


def model_for(config: Config) -> Reply:
    """Claude when ANTHROPIC_API_KEY is set, else the echo model."""
    if not config.anthropic_api_key:
        return echo_reply
    import anthropic

    return claude_reply(anthropic.AsyncAnthropic(api_key=config.anthropic_api_key), config.model)


async def run(config: Config) -> None:
    """Run the bot until it is stopped; every connection is closed on the way out."""
    producer = AsyncProducer.from_url(config.redis_url)
    reader = AsyncContextReader.from_url(config.database_url, replica_url=config.replica_url)
    notes = AsyncNotifications.from_url(config.redis_url, SOURCE, group=f"discord-{config.agent}")
    bot = ContextBot(producer, reader, agent=config.agent, reply=model_for(config))
    client = DiscordClient(bot, notes, guild_id=config.guild_id)  # closes `notes` with it
    try:
        async with client:
            await client.start(config.discord_token)
    finally:
        await reader.aclose()
        await producer.aclose()


def main() -> None:
    """Entry point: configuration from the environment, then the bot."""
    try:
        config = Config.from_env(os.environ)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    discord.utils.setup_logging()
    asyncio.run(run(config))


if __name__ == "__main__":
    main()
