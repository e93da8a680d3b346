"""Ingest, jobs, CLI and configuration: the processes of the Procfile."""
