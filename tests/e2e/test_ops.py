"""The Procfile's processes as operators run them: metrics endpoints, and logs that never
carry message content at info level or a secret."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest
import redis

from contextlog.producers import ContextReader, Producer
from contextlog.producers.notifications import Notifications
from contextlog.schema import notices as nt
from tests.support.fake_anthropic import FakeAPIServer
from tests.support.processes import Process
from tests.support.running import eventually
from tests.support.servers import free_port

pytestmark = pytest.mark.e2e

SECRET = "sk-ant-test-SECRET-0123456789"
CONTENT = "the launch code is PURPLE-ELEPHANT-42"


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_and_logs_of_ingest_and_worker(db: str, redis_url: str, tmp_path: Path) -> None:
    with FakeAPIServer(latency=0.01, text="They discussed the launch.") as api:
        env = {
            **os.environ,
            "DATABASE_URL": db,
            "REDIS_URL": redis_url,
            "CONTEXTLOG_SHARDS": "4",
            "CONTEXTLOG_LOG_LEVEL": "info",
            "CONTEXTLOG_LOG_FORMAT": "json",
            "ANTHROPIC_API_KEY": SECRET,
            "ANTHROPIC_BASE_URL": api.url,
        }
        ingest_port, worker_port = free_port(), free_port()
        ingest = Process("ingest", env, tmp_path / "ingest.log")
        worker = Process("worker", env, tmp_path / "worker.log")
        ingest.argv_extra = ["--metrics-port", str(ingest_port)]
        worker.argv_extra = ["--metrics-port", str(worker_port)]
        producer = Producer(redis.Redis.from_url(redis_url), shards=4)
        reader = ContextReader.from_url(db)
        notes = Notifications(redis.Redis.from_url(redis_url), "ops", consumer="t")
        try:
            ingest.start()
            worker.start()
            for i in range(20):
                producer.post_message("alpha", "ops", "user", f"{CONTENT} #{i}", source="ops")
            producer.redis.xadd("contextlog:in:{0}", {b"e": b"not json"})  # a dead letter
            producer.save("alpha", "ops", "launch", source="ops")

            def summarised() -> bool:
                got = notes.read(block_ms=100)
                notes.ack(got)
                return any(n.kind == nt.SUMMARY_READY for n in got)

            eventually(summarised, timeout=30, what=f"the summary\n{worker.tail()}")
            assert api.requests_served >= 1
            eventually(  # 20 messages, the save, the summary (counted after its XACK)
                lambda: value(metrics(ingest_port), "contextlog_events_ingested_total") == 22,
                what="the ingest counter",
            )
            m = metrics(ingest_port)
            assert value(m, "contextlog_batch_seconds_count") >= 1
            assert value(m, 'contextlog_dead_letters_total{reason="malformed"}') == 1
            w = metrics(worker_port)
            assert value(w, 'contextlog_summaries_total{outcome="api"}') == 1
        finally:
            ingest.stop()
            worker.stop()
            producer.close()
            reader.close()
            notes.close()
    logs = (tmp_path / "ingest.log").read_text() + (tmp_path / "worker.log").read_text()
    assert "session summarised" in logs and '"agent": "alpha"' in logs  # ids are bound
    assert SECRET not in logs
    assert "PURPLE-ELEPHANT" not in logs
