"""`contextlog chat`: a terminal chat client that is a real adapter on `producers`.

Typed lines are posted as user messages; the reply comes from Claude with the context
`ContextReader` returns (when ANTHROPIC_API_KEY is set) or from an offline echo model,
and is posted back as the assistant's message. `/context ...` commands go to the
producer; notifications (saves, summaries, refusals) are printed as they arrive.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

from contextlog.producers import ContextReader, Producer
from contextlog.producers.commands import parse_duration
from contextlog.producers.context import Context
from contextlog.producers.notifications import Notifications
from contextlog.schema.errors import ContextlogError
from contextlog.schema.notices import Notice
from contextlog.worker.app.config import Settings
from contextlog.worker.cli import common as cli_common

SOURCE = "chat"
HELP = """commands:
  /context save [description]       save the conversation as a session
  /context clear                    start afresh (the log keeps everything)
  /context history [page]           saved sessions, newest first
  /context restore <id|last>        bring a saved session back
  /context settings idle=10m window=24h budget=16000
  /quit"""
_SETTINGS = {"idle": "idle_timeout", "window": "rolling_window", "budget": "token_budget"}

Reply = Callable[[Context, str], str]


def echo_model(ctx: Context, text: str) -> str:
    """The offline model: says back what it got."""
    return f"(echo) {text}"


def context_tag(ctx: Context) -> str:
    """How much context the reply saw: shown after it, never stored with it (it would
    end up in the conversation, its summaries and the next contexts)."""
    summarised = ", older part summarised" if ctx.compacted else ""
    return f"[context: {len(ctx.messages)} turns, ~{ctx.token_estimate} tokens{summarised}]"


SYSTEM_PROMPT = "You are a helpful assistant talking with someone in a terminal."


def claude_model(settings: Settings) -> Reply:
    """Replies from the Messages API with the conversation's context."""
    import anthropic

    client = anthropic.Anthropic(
        api_key=settings.anthropic_api_key, base_url=settings.anthropic_base_url
    )

    def reply(ctx: Context, text: str) -> str:
        answer = client.messages.create(
            model=settings.summary_model,
            max_tokens=1024,
            **ctx.to_anthropic(system=SYSTEM_PROMPT, cache=True),
        )
        return "".join(b.text for b in answer.content if getattr(b, "type", "") == "text")

    return reply


def describe(n: Notice) -> str:
    """One line for a notification."""
    if n.kind == "summary_ready":
        head = "auto-saved session summary" if n.auto else "summary"
        return f"* {head} ({n.session_id}): {n.text}"
    if n.kind == "command_refused":
        return f"* refused: {n.text}"
    return f"* {n.text or n.kind}"


class Chat:
    """One terminal conversation (agent, channel)."""

    def __init__(
        self,
        producer: Producer,
        reader: ContextReader,
        notes: Notifications,
        agent: str,
        channel: str,
        reply: Reply,
        out: TextIO = sys.stdout,
    ) -> None:
        self.producer, self.reader, self.notes = producer, reader, notes
        self.agent, self.channel = agent, channel
        self.reply = reply
        self.out = out
        self._print_lock = threading.Lock()

    def say(self, line: str) -> None:
        """Print a line without tearing another thread's."""
        with self._print_lock:
            print(line, file=self.out, flush=True)

    def prompt(self) -> None:
        """The input prompt."""
        with self._print_lock:
            print("you> ", end="", file=self.out, flush=True)

    def listen(self, stop: threading.Event) -> None:
        """Print this conversation's notifications until `stop`."""
        while not stop.is_set():
            try:
                batch = self.notes.read(count=50, block_ms=500)
            except ContextlogError as e:
                self.say(f"* notifications unavailable: {e}")
                stop.wait(2)
                continue
            for n in batch:
                if (n.agent, n.channel) == (self.agent, self.channel):
                    self.say(describe(n))
            self.notes.ack(batch)

    def handle(self, line: str) -> bool:
        """One typed line; False to quit."""
        text = line.strip()
        if not text:
            return True
        if text in ("/quit", "/exit"):
            return False
        try:
            if text.startswith("/"):
                self.command(text)
            else:
                self.message(text)
        except (ContextlogError, ValueError) as e:
            self.say(f"error: {e}")
        return True

    def message(self, text: str) -> None:
        """Post the user's message, answer it with the context, post the answer."""
        key = (self.agent, self.channel)
        eid = self.producer.post_message(*key, "user", text, source=SOURCE, sender="terminal")
        ctx = self.reader.context(*key, wait_for=eid, timeout=5)
        answer = self.reply(ctx, text) or "(no answer)"
        self.producer.post_message(*key, "assistant", answer, source=SOURCE)
        self.say(f"{self.agent}> {answer}  {context_tag(ctx)}")

    def command(self, text: str) -> None:
        """`/context <verb> ...`."""
        words = text.split()
        if words[0] != "/context" or len(words) < 2:
            self.say(HELP)
            return
        verb, rest = words[1], words[2:]
        key = (self.agent, self.channel)
        if verb == "save":
            self.producer.save(*key, " ".join(rest) or None, source=SOURCE)
        elif verb == "clear":
            self.producer.clear(*key, source=SOURCE)
            self.say("* cleared")
        elif verb == "history":
            self.history(int(rest[0]) if rest else 1)
        elif verb == "restore" and rest:
            self.producer.restore(*key, rest[0], source=SOURCE)
        elif verb == "settings" and rest:
            self.settings(rest)
        else:
            self.say(HELP)

    def history(self, page: int) -> None:
        """One page of saved sessions."""
        p = self.reader.sessions(self.agent, self.channel, page=page)
        self.say(f"sessions, page {p.page} of {p.pages} ({p.total} saved):")
        for s in p:
            summary = s.summary if s.summary is not None else "(summary pending)"
            auto = " [auto]" if s.auto else ""
            self.say(
                f"  {s.session_id}{auto}  {s.message_count} msgs  {s.description or s.preview}"
            )
            self.say(f"      {summary}")

    def settings(self, pairs: list[str]) -> None:
        """`idle=10m window=24h budget=8000`."""
        changes: dict[str, Any] = {}
        for pair in pairs:
            name, _, value = pair.partition("=")
            if name not in _SETTINGS or not value:
                raise ValueError(f"unknown setting {pair!r} (use idle=, window=, budget=)")
            changes[_SETTINGS[name]] = int(value) if name == "budget" else parse_duration(value)
        self.producer.configure(self.agent, self.channel, source=SOURCE, **changes)
        self.say("* settings sent: " + ", ".join(f"{k}={v}" for k, v in changes.items()))


def run(settings: Settings, agent: str, channel: str, stdin: TextIO = sys.stdin) -> int:
    """The interactive loop; returns at end of input or /quit."""
    # Both servers are checked first: a chat that cannot reach them exits (code 3) at
    # once instead of failing line by line.
    reader = cli_common.reader(settings)  # its pool opens on first use: nothing to close
    producer = cli_common.producer(settings)
    notes = Notifications(producer.redis, SOURCE, group=f"chat-{agent}-{channel}")
    reply = claude_model(settings) if settings.anthropic_api_key else echo_model
    chat = Chat(producer, reader, notes, agent, channel, reply)
    model = "Claude" if settings.anthropic_api_key else "the offline echo model"
    chat.say(f"contextlog chat with {agent} in {channel}; replies from {model}. /help, /quit")
    stop = threading.Event()
    listener = threading.Thread(target=chat.listen, args=(stop,), daemon=True)
    listener.start()
    try:
        while True:
            chat.prompt()
            line = stdin.readline()
            if not line or not chat.handle(line):
                break
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        listener.join(timeout=2)
        producer.close()
        reader.close()
        notes.close()
    return 0
