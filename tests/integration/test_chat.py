"""`contextlog chat` on real servers: `/context settings` shows the conversation's own
settings, or the deployment's defaults where it has none."""

from __future__ import annotations

import io
from typing import Any

from contextlog.producers import ContextReader, Producer
from contextlog.schema.defaults import ConversationDefaults
from contextlog.worker.dev.chat import Chat, echo_model
from tests.support.running import running, settings_for


def test_settings_without_arguments_shows_them(db: str, redis_url: str) -> None:
    settings = settings_for(db, redis_url)
    producer = Producer.from_url(redis_url, shards=settings.shards)
    reader = ContextReader.from_url(db)
    out = io.StringIO()
    defaults = ConversationDefaults(idle_timeout=1800, rolling_window=86400, token_budget=16000)
    notes: Any = None  # not listened to here
    chat = Chat(producer, reader, notes, "alpha", "tty", echo_model, out, defaults)
    try:
        with running(settings):
            chat.handle("/context settings")
            eid = producer.configure("alpha", "tty", idle_timeout=0, token_budget=8000)
            reader.context("alpha", "tty", wait_for=eid)
            chat.handle("/context settings")
    finally:
        reader.close()
        producer.close()
    assert out.getvalue().splitlines() == [
        "* settings: idle=30m (default) window=1d (default) budget=16000 (default)",
        "* settings: idle=0 window=1d (default) budget=8000",
    ]
