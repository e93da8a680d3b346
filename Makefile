# Developer entry points. Targets that need Postgres and Redis run through worker.devenv,
# which embeds a server under .contextlog/ for DATABASE_URL / REDIS_URL when one is unset.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
DEVENV := $(VENV)/bin/python -m worker.devenv --

.PHONY: venv test demo bench lint run clean

venv: $(STAMP)

# Reinstalls when pyproject.toml changes; an existing venv is reused, not recreated.
$(STAMP): pyproject.toml
	@[ -x $(VENV)/bin/python ] || $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  2>/dev/null || { echo "error: contextlog needs Python 3.11+ and '$(PYTHON)' is missing or" \
	  "older; run: make PYTHON=python3.11 $(MAKECMDGOALS)" >&2; exit 1; }
	[ -x $(VENV)/bin/python ] || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -e '.[dev]'
	touch $@

# pytest exits 5 when it collects no test; that is not a failure here.
test: $(STAMP)
	$(DEVENV) $(VENV)/bin/python -m pytest $(PYTEST_ARGS) || [ $$? -eq 5 ]

demo: $(STAMP)
	$(DEVENV) $(VENV)/bin/contextlog demo

bench: $(STAMP)
	$(DEVENV) $(VENV)/bin/python -m tests.bench.run

# The whole stack of the Procfile (ingest, worker, dashboard on 127.0.0.1:9181) under honcho.
run: $(STAMP)
	$(DEVENV) env PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/honcho start

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Servers left running by `devenv --keep` are stopped first: a devenv run adopts and stops them.
clean:
	@if [ -x $(VENV)/bin/python ] && { [ -S .contextlog/redis.sock ] || \
	    [ -f .contextlog/pgdata/postmaster.pid ]; }; then \
	  env -u DATABASE_URL -u REDIS_URL $(DEVENV) true; fi
	rm -rf .contextlog
