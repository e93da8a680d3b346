"""The gate: which entries of a batch go on to the log and which to the dead letters.

The first stage of the write path (docs/architecture.md): each entry is decoded by the
contract's codec (`codec.decode_fields`, the one rule every producer also runs); a
worker's result must carry a worker's signature of its bytes (`forged` otherwise); an
entry caught alone after more than `max_deliveries` deliveries is `poison`. Pure: no
Redis, no Postgres.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contextlog.schema import codec, signing
from contextlog.schema import events as ev
from contextlog.schema.errors import EventRejected
from contextlog.worker.ingest.streams import Entry, Fields, Rejected
from contextlog.worker.store.eventlog import Accepted

POISON = "poison"


@dataclass(frozen=True)
class Gate:
    """The rules one ingest process applies to every entry it reads."""

    max_entry_bytes: int
    max_deliveries: int
    signing_key: signing.Key | None  # results are taken when signed with it (none: never)

    def sort_out(
        self,
        entries: Sequence[Entry],
        deliveries: dict[str, int],
        suspects: tuple[str, str] | None,
    ) -> tuple[list[Accepted], list[Rejected]]:
        """The entries to append, in order, and those to dead-letter, with their reasons."""
        accepted: list[Accepted] = []
        rejected: list[Rejected] = []
        for entry_id, fields in entries:
            times = deliveries.get(entry_id, 1)
            if suspects == (entry_id, entry_id) and times > self.max_deliveries:
                rejected.append(Rejected(entry_id, fields, POISON, f"delivered {times} times"))
                continue
            try:
                event = codec.decode_fields(fields, self.max_entry_bytes)
            except EventRejected as e:
                rejected.append(Rejected(entry_id, fields, e.reason, e.detail))
                continue
            payload = fields[codec.ENTRY_FIELD]
            if signing.is_result(event) and not self.signed(payload, fields):
                detail = f"{ev.kind_of(event)} is a worker's result, without a worker's signature"
                rejected.append(Rejected(entry_id, fields, codec.FORGED, detail))
                continue
            accepted.append(Accepted(entry_id, event, payload))
        return accepted, rejected

    def signed(self, payload: bytes, fields: Fields) -> bool:
        """Whether an entry carries a worker's signature of its bytes."""
        key = self.signing_key
        return key is not None and key.verify(payload, fields.get(signing.SIGNATURE_FIELD))
