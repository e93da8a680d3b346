"""`contextlog chat`: a terminal chat client that is a real adapter on `producers`.

Typed lines are posted as user messages; the reply comes from Claude with the context
`ContextReader` returns (when ANTHROPIC_API_KEY is set) or from an offline echo model,
and is posted back as the assistant's message. `/context ...` commands go to the
producer; notifications (saves, summaries, refusals) are printed as they arrive.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

import anthropic
from psycopg.rows import dict_row

from contextlog.producers import ContextReader, Producer
from contextlog.producers.commands import parse_duration
from contextlog.producers.context import Context
from contextlog.producers.notifications import Notifications
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.errors import ContextlogError, ModelFailed, one_line
from contextlog.schema.notices import Notice
from contextlog.schema.queries import query
from contextlog.worker.app.config import Settings
from contextlog.worker.cli import common as cli_common

SOURCE = "chat"
HELP = """commands:
  /context save [description]       save the conversation as a session
  /context clear                    start afresh (the log keeps everything)
  /context history [page]           saved sessions, newest first
  /context search <words>           what this conversation said ("phrase", prefix*, -word)
  /context restore <id|last>        bring a saved session back
  /context settings                 this conversation's settings
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


def claude_client(settings: Settings) -> anthropic.Anthropic:
    """The Messages API client of a chat: each request bounded by
    CONTEXTLOG_SUMMARY_TIMEOUT, with the SDK's own retries (429, 5xx, network) first."""
    return anthropic.Anthropic(
        api_key=settings.anthropic_api_key,
        base_url=settings.anthropic_base_url,
        timeout=settings.summary_timeout,
    )


def claude_model(client: anthropic.Anthropic, model: str) -> Reply:
    """Replies from the Messages API with the conversation's context; a failed request
    is `ModelFailed`, which the chat shows in one line and survives."""

    def reply(ctx: Context, text: str) -> str:
        try:
            answer = client.messages.create(
                model=model, max_tokens=1024, **ctx.to_anthropic(system=SYSTEM_PROMPT, cache=True)
            )
        except anthropic.AnthropicError as e:
            raise ModelFailed(api_failure(e)) from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            # The SDK lets a body that does not parse escape as the bare decode error.
            raise ModelFailed(f"the Anthropic API sent an answer that is not JSON ({e})") from e
        content = getattr(answer, "content", None) or []
        return "".join(b.text for b in content if getattr(b, "type", "") == "text")

    return reply


def api_failure(error: anthropic.AnthropicError) -> str:
    """What went wrong with a request, for a person, on one line."""
    if isinstance(error, anthropic.APITimeoutError):
        return "the Anthropic API did not answer in time (CONTEXTLOG_SUMMARY_TIMEOUT)"
    if isinstance(error, anthropic.APIConnectionError):
        return f"cannot reach the Anthropic API: {one_line(error)}"
    if isinstance(error, anthropic.RateLimitError):
        return "the Anthropic API is rate limiting this key (HTTP 429)"
    if isinstance(error, anthropic.AuthenticationError):
        return "the Anthropic API refused ANTHROPIC_API_KEY (HTTP 401)"
    if isinstance(error, anthropic.APIStatusError):
        said = one_line(_api_message(error.body) or error.message)[:200]
        return f"the Anthropic API answered HTTP {error.status_code}: {said}"
    return f"the Anthropic API request failed: {one_line(error)[:200]}"


def describe(n: Notice) -> str:
    """One line for a notification."""
    if n.kind == "summary_ready":
        head = "auto-saved session summary" if n.auto else "summary"
        return f"* {head} ({n.session_id}): {n.text}"
    if n.kind == "command_refused":
        return f"* refused: {n.text}"
    return f"* {n.text or n.kind}"


PROMPT = "you> "
_ERASE_LINE = "\r\x1b[K"  # back to the line's start, erase it (a terminal's control codes)


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
        defaults: ConversationDefaults | None = None,
    ) -> None:
        self.producer, self.reader, self.notes = producer, reader, notes
        self.agent, self.channel = agent, channel
        self.reply = reply
        self.out = out
        self.defaults = defaults or ConversationDefaults()
        self._print_lock = threading.Lock()
        self._prompting = False  # the prompt is the last thing on the screen

    def say(self, line: str) -> None:
        """Print a line without tearing another thread's."""
        with self._print_lock:
            print(line, file=self.out, flush=True)

    def notify(self, line: str) -> None:
        """Print a notification as it arrives: on its own line, with the prompt drawn
        again below it when it came while the prompt waited for input."""
        with self._print_lock:
            if not self._prompting:
                print(line, file=self.out, flush=True)
                return
            clear = _ERASE_LINE if self.out.isatty() else "\n"
            print(f"{clear}{line}\n{PROMPT}", end="", file=self.out, flush=True)

    def prompt(self) -> None:
        """The input prompt."""
        with self._print_lock:
            print(PROMPT, end="", file=self.out, flush=True)
            self._prompting = True

    def answered(self) -> None:
        """A line was typed: the cursor is on a fresh line, the prompt gone."""
        with self._print_lock:
            self._prompting = False

    def listen(self, stop: threading.Event) -> None:
        """Print this conversation's notifications until `stop`."""
        while not stop.is_set():
            try:
                batch = self.notes.read(count=50, block_ms=500)
                for n in batch:
                    if (n.agent, n.channel) == (self.agent, self.channel):
                        self.notify(describe(n))
                self.notes.ack(batch)
            except ContextlogError as e:
                self.notify(f"* notifications unavailable: {one_line(e)}")
                stop.wait(2)

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
        except ModelFailed as e:
            self.say(f"error: no reply: {e}; your message is kept, send another to try again")
        except (ContextlogError, ValueError) as e:
            self.say(f"error: {one_line(e)}")
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
        elif verb == "search" and rest:
            self.producer.search(*key, " ".join(rest), source=SOURCE)
        elif verb == "settings" and rest:
            self.settings(rest)
        elif verb == "settings":
            self.show_settings()
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

    def show_settings(self) -> None:
        """This conversation's settings, as configured or the deployment's defaults."""
        params = {"agent": self.agent, "channel": self.channel}
        with self.reader.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            row = cur.execute(query("conversation_settings"), params).fetchone() or {}
        shown = []
        for word, name in _SETTINGS.items():
            value = row.get(name)
            seconds = getattr(self.defaults, name) if value is None else value
            text = str(seconds) if word == "budget" else duration(seconds)
            shown.append(f"{word}={text}" + (" (default)" if value is None else ""))
        self.say("* settings: " + " ".join(shown))

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


def _api_message(body: object) -> str | None:
    """The `error.message` of the API's error envelope, if the body is one."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None


def duration(seconds: int) -> str:
    """Seconds in the largest unit that divides them: 1800 -> 30m, 86400 -> 1d, 0 -> 0."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s" if seconds else "0"


def run(settings: Settings, agent: str, channel: str, stdin: TextIO = sys.stdin) -> int:
    """The interactive loop; returns at end of input or /quit."""
    # Both servers are checked first: a chat that cannot reach them exits (code 3) at
    # once instead of failing line by line.
    reader = cli_common.reader(settings)  # its pool opens on first use: nothing to close
    producer = cli_common.producer(settings)
    notes = Notifications(producer.redis, SOURCE, group=f"chat-{agent}-{channel}")
    reply = (
        claude_model(claude_client(settings), settings.summary_model)
        if settings.anthropic_api_key
        else echo_model
    )
    chat = Chat(producer, reader, notes, agent, channel, reply, defaults=settings.conversation)
    model = "Claude" if settings.anthropic_api_key else "the offline echo model"
    chat.say(f"contextlog chat with {agent} in {channel}; replies from {model}. /help, /quit")
    stop = threading.Event()
    listener = threading.Thread(target=chat.listen, args=(stop,), daemon=True)
    listener.start()
    try:
        while True:
            chat.prompt()
            line = stdin.readline()
            chat.answered()
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
