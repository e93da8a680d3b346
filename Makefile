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
# Logs: the console form on a terminal (JSON lines into a file or pipe), without a time of
# their own, as honcho stamps each line; a variable set by the caller wins.
run: $(STAMP)
	@if [ -t 1 ]; then format=console; else format=json; fi; \
	$(DEVENV) env PATH="$(CURDIR)/$(VENV)/bin:$$PATH" \
	  CONTEXTLOG_LOG_FORMAT="$${CONTEXTLOG_LOG_FORMAT:-$$format}" \
	  CONTEXTLOG_LOG_TIMESTAMPS="$${CONTEXTLOG_LOG_TIMESTAMPS:-0}" $(VENV)/bin/honcho start

# From a second terminal while `make run` (or a --keep run) is up: CMD on its servers, e.g.
# `make attach CMD='contextlog status'`; without CMD, a shell with DATABASE_URL and REDIS_URL.
# CMD reaches `sh -c` as written: $(value ...) keeps make from expanding its `$`, so
# CMD='psql "$$DATABASE_URL"' is not needed: CMD='psql "$DATABASE_URL"' works.
attach: $(STAMP)
	@PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/python -m contextlog.worker.dev.devenv --attach -- \
	  $(if $(value CMD),sh -c '$(subst ','\'',$(value CMD))',$${SHELL:-sh})

# mypy checks the benchmarks too, so it needs their peers (the bench extra). It cannot see
# through the editable install's import hook: it reads the package through
# .typing/contextlog/, links to the top-level folders under their import names.
lint: $(BENCH_STAMP)
	$(VENV)/bin/ruff check .
	@mkdir -p .typing/contextlog
	@for d in schema producers worker; do ln -sfn ../../$$d .typing/contextlog/$$d; done
	$(VENV)/bin/mypy

# `.hypothesis/` holds what HYPOTHESIS_PROFILE=dev runs stored to replay. `.contextlog/`
# holds the embedded database, every conversation and session in it: its servers are
# stopped (refused while `make run` uses them), then it is deleted only after a yes typed
# on a terminal, or with FORCE=1; without a terminal (a script, CI) it is kept and the
# target fails, saying so.
clean:
	rm -rf .hypothesis
	@if [ -d .contextlog ]; then \
	  if [ -x $(VENV)/bin/python ]; then \
	    $(VENV)/bin/python -m contextlog.worker.dev.devenv --stop || exit 1; fi; \
	  if [ "$(FORCE)" != 1 ]; then \
	    if [ ! -t 0 ]; then \
	      echo "make clean: kept .contextlog/, the embedded database with every conversation" \
	        "and session; to delete it too: make clean FORCE=1" >&2; exit 1; fi; \
	    printf 'Delete .contextlog/, the embedded database with every conversation and session? [y/N] '; \
	    read answer; \
	    case "$$answer" in [yY]|[yY][eE][sS]) ;; *) echo "kept .contextlog/"; exit 0;; esac; \
	  fi; \
	  rm -rf .contextlog; echo "deleted .contextlog/"; \
	fi
