"""Handlers of an agent's memory as a whole: search everything its conversations said,
erase what a person (or a conversation, or a session) said, everywhere it lives."""

from __future__ import annotations

from contextlog.schema.errors import EventRejected
from contextlog.worker.api import models as m
from contextlog.worker.api.app import Call
from contextlog.worker.api.problems import from_error


async def search(call: Call) -> m.SearchOut:
    """One page of the agent's messages matching `q`, best first (`ContextReader.search`);
    bad input is 409 `refused` with the reason."""
    q: m.SearchQuery = call.query
    page = await call.services.reader.search(
        call.agent,
        q.q,
        channel=q.channel,
        thread=q.thread,
        sender=q.sender,
        since=q.since,
        until=q.until,
        page=q.page,
        per_page=q.per_page,
    )
    return m.SearchOut(
        query=page.query,
        hits=page.hits,
        page=page.page,
        per_page=page.per_page,
        total=page.total,
        pages=page.pages,
        capped=page.capped,
    )


async def erase(call: Call) -> m.BatchAccepted:
    """Erase (`Producer.erase`: signed with the deployment's key, applied by ingest in
    each shard's order); the event ids, one per shard for a sender. Export files a host
    wrote are deleted only by `contextlog erase` on that host."""
    b: m.EraseIn = call.body
    try:
        ids = await call.services.producer.erase(
            call.agent,
            channel=b.channel,
            sender=b.sender,
            session_id=b.session_id,
            source=b.source,
        )
    except EventRejected as e:
        raise from_error(e) from e
    return m.BatchAccepted(event_ids=ids)
