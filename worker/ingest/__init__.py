"""The ingest engine: shard leases, stream reads, batches, dead letters."""
