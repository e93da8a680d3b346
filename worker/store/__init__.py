"""The event log on Postgres: the append, projections, command handlers, migrations,
rebuild, retention, export and import."""
