"""Webhooks end to end: registered over HTTP, fanned out by the dispatcher, delivered by RQ
jobs with Standard Webhooks signatures, retried, failed, replayed, never twice per notice."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
import redis
from rq import Queue, SimpleWorker

from contextlog.producers import ContextReader, Producer
from contextlog.worker.app import bootstrap
from contextlog.worker.app.clock import SystemClock
from contextlog.worker.cli import main as cli
from contextlog.worker.effects import webhooks as wh
from contextlog.worker.tasks import webhooks as hooks
from contextlog.worker.tasks.resources import Resources
from contextlog.worker.tasks.summarize import LocalSummarizer
from contextlog.worker.tasks.timers import Timers
from tests.support.api import Api, make_key, receiver, serving
from tests.support.running import running, settings_for

A, C = "alpha", "general"


@pytest.fixture
def api(db: str, redis_url: str, rds: redis.Redis) -> Iterator[Api]:
    settings = settings_for(
        db, redis_url, CONTEXTLOG_WEBHOOK_ALLOW_PRIVATE="true", CONTEXTLOG_WEBHOOK_ATTEMPTS="2"
    )
    reader = ContextReader.from_url(db)
    producer = Producer(redis.Redis.from_url(redis_url), shards=4)
    resources = Resources(settings, reader, producer, LocalSummarizer(), SystemClock(), Timers(rds))
    bootstrap.install(resources)
    with running(settings), serving(settings) as a:
        yield a
    reader.close()
    producer.close()


def dispatch(api: Api, db: str, rds: redis.Redis) -> int:
    deliveries = hooks.Deliveries(rds, api.settings.webhook_attempts)
    dispatcher = hooks.Dispatcher(lambda: psycopg.connect(db), rds, deliveries, "test")
    return dispatcher.cycle()


def run_jobs(rds: redis.Redis) -> None:
    queue = Queue(hooks.QUEUE, connection=rds)
    SimpleWorker([queue], connection=rds).work(burst=True, logging_level="WARNING")


def saved(api: Api, token: str) -> None:
    """A message and a save, stored (so its session_saved notice is out)."""
    headers = api.headers(token)
    conv = f"/v1/agents/{A}/channels/{C}"
    api.client.post(conv + "/messages", json={"role": "user", "content": "hi"}, headers=headers)
    eid = api.client.post(conv + "/sessions", json={"source": "bot"}, headers=headers).json()
    api.client.get(
        conv + "/context", params={"wait_for": eid["event_id"], "timeout": 10}, headers=headers
    )


def test_a_notice_is_delivered_signed_once_and_replayed_on_demand(
    api: Api,
    db: str,
    rds: redis.Redis,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABASE_URL", db)  # for the CLI
    monkeypatch.setenv("REDIS_URL", api.settings.redis_url)
    token = make_key(db, [A], "post,read,sessions,admin")
    with receiver() as (url, got):
        body = {"url": url, "source": "bot", "kinds": ["session_saved"]}
        created = api.client.post("/v1/webhooks", json=body, headers=api.headers(token))
        assert created.status_code == 201, created.text
        hook = created.json()
        assert hook["secret"].startswith("whsec_") and hook["agents"] == [A]
        saved(api, token)
        assert dispatch(api, db, rds) == 1
        assert dispatch(api, db, rds) == 0  # read and acknowledged: nothing twice
        with psycopg.connect(db) as conn:  # named by its conversation, for retention and erase
            row = conn.execute("SELECT agent, channel FROM webhook_deliveries").fetchall()
        assert row == [(A, C)]
        run_jobs(rds)
        ((headers, payload),) = got.requests
        assert wh.verify(hook["secret"], headers, payload, now=int(time.time()))
        assert b'"type":"session_saved"' in payload
        listed = api.client.get(
            f"/v1/webhooks/{hook['webhook_id']}/deliveries", headers=api.headers(token)
        ).json()["deliveries"]
        assert [(d["status"], d["attempts"]) for d in listed] == [("delivered", 1)]
        delivery = listed[0]["delivery_id"]
        assert headers["webhook-id"] == delivery
        path = f"/v1/webhooks/{hook['webhook_id']}/deliveries/{delivery}/replay"
        assert api.client.post(path, headers=api.headers(token)).status_code == 202
        run_jobs(rds)
        assert [h["webhook-id"] for h, _ in got.requests] == [delivery, delivery]
        assert cli.main(["webhooks", "deliveries", "--json"]) == 0
        assert delivery in capsys.readouterr().out
        assert cli.main(["webhooks", "replay", "msg_nope"]) == 2


def test_a_failing_target_is_retried_then_failed(api: Api, db: str, rds: redis.Redis) -> None:
    token = make_key(db, [A], "post,read,sessions,admin")
    with receiver(status=500) as (url, got):
        body = {"url": url, "source": "bot", "kinds": ["session_saved"]}
        hook = api.client.post("/v1/webhooks", json=body, headers=api.headers(token)).json()
        saved(api, token)
        dispatch(api, db, rds)
        run_jobs(rds)  # attempt 1 fails; RQ schedules the retry in BACKOFF_S[0]
        with psycopg.connect(db) as conn:
            (row,) = hooks.deliveries(conn, hook["webhook_id"])
            assert (row.status, row.attempts, row.last_status) == ("pending", 1, 500)
            policy = hooks.policy_of(api.settings)
            # the retry, run as RQ would once it is due (attempts: 2)
            assert hooks.attempt(conn, row.delivery_id, policy, row.updated_at) == "failed"
            assert hooks.attempt(conn, row.delivery_id, policy, row.updated_at) == "skipped"
        assert len(got.requests) == 2


def test_targets_outside_the_allowed_hosts_are_refused(db: str, redis_url: str) -> None:
    settings = settings_for(db, redis_url, CONTEXTLOG_WEBHOOK_HOSTS="hooks.example.com")
    token = make_key(db, [A], "admin")
    with serving(settings) as api:
        body = {"url": "http://127.0.0.1:9/x", "source": "bot", "kinds": ["session_saved"]}
        r = api.client.post("/v1/webhooks", json=body, headers=api.headers(token))
        assert r.status_code == 422 and "CONTEXTLOG_WEBHOOK_HOSTS" in r.json()["detail"]
        body["kinds"] = ["nope"]
        assert (
            api.client.post("/v1/webhooks", json=body, headers=api.headers(token)).status_code
            == 422
        )
