# Developer entry points. Targets that need Postgres and Redis run through contextlog.worker.dev.devenv,
# which embeds a server under .contextlog/ for DATABASE_URL / REDIS_URL when one is unset.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
DEVENV := $(VENV)/bin/python -m contextlog.worker.dev.devenv --

.PHONY: venv test demo bench lint run attach clean

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

# The peers it compares against (the `bench` extra) are installed on first use.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(VENV)/bin/pip install -e '.[dev,bench]'
	touch $@

bench: $(BENCH_STAMP)
	$(DEVENV) $(VENV)/bin/python -m tests.bench.run

# The whole stack of the Procfile (ingest, worker, the HTTP API on 127.0.0.1:8420, dashboard on
# 127.0.0.1:9181) under honcho.
# It prints the embedded servers' URLs; closing its terminal or killing it stops everything.
run: $(STAMP)
	$(DEVENV) env PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/honcho start

# From a second terminal while `make run` (or a --keep run) is up: CMD on its servers, e.g.
# `make attach CMD='contextlog status'`; without CMD, a shell with DATABASE_URL and REDIS_URL.
attach: $(STAMP)
	@PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/python -m contextlog.worker.dev.devenv --attach -- \
	  $(if $(CMD),sh -c "$$CMD",$${SHELL:-sh})

# mypy checks the benchmarks too, so it needs their peers (the bench extra). It cannot see
# through the editable install's import hook: it reads the package through
# .typing/contextlog/, links to the top-level folders under their import names.
lint: $(BENCH_STAMP)
	$(VENV)/bin/ruff check .
	@mkdir -p .typing/contextlog
	@for d in schema producers worker; do ln -sfn ../../$$d .typing/contextlog/$$d; done
	$(VENV)/bin/mypy

# Servers left running by `devenv --keep` are stopped first.
clean:
	@if [ -x $(VENV)/bin/python ] && [ -d .contextlog ]; then \
	  $(VENV)/bin/python -m contextlog.worker.dev.devenv --stop; fi
	rm -rf .contextlog
