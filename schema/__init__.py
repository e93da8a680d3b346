"""The contract: event types, their codec, Redis key names and SQL. Imports nothing of ours."""
