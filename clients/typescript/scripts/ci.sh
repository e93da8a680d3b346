#!/usr/bin/env bash
# The TypeScript client's tests and examples against a real `contextlog api` (with ingest
# and worker), started by the tests through tests/support/api_server.py on DATABASE_URL's
# server and REDIS_URL's database. Needs the repository's .venv (`make venv`).
set -euo pipefail
cd "$(dirname "$0")/.."
node --version
npm ci --no-audit --no-fund
npm test
