# torchship: `make pipeline` runs everything on the embedded default; `make test` runs the tests.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# TELEMETRY_OFF of tasks/core/env.py (make cannot import it; tests/unit/test_env.py checks this line)
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true DVC_NO_ANALYTICS=1 PREFECT_SERVER_ANALYTICS_ENABLED=false GX_ANALYTICS_ENABLED=false

.PHONY: install prometheus stack-deps lint pipeline test test-fast bench bench-tables bench-sweep docs clean

# Many tests wait on subprocesses and servers, so three workers overlap well on two cores; tests that share
# a module (or a named group) stay on one worker (`--dist loadgroup`), taken in the order tests/conftest.py sorts.
XDIST := -n 3 --dist loadgroup --no-loadscope-reorder

# Debian packages, as command:package pairs: only the missing ones are installed, after one quiet
# `apt-get update` (a fresh machine has no package index, and `apt-get install` alone fails there).
apt_install = missing=; for pair in $(1); do command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair\#*:}"; done; \
	[ -z "$$missing" ] || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $$missing >/dev/null 2>&1; }

install: $(STAMP)

# Where there is no NVIDIA GPU, install the CPU build of torch first (a local wheel on our machines):
# an open torch range in a fresh venv would otherwise pull a multi-GB CUDA build. The rest goes in with uv
# (~40 s instead of pip's ~4 min on 2 cores, the same versions), or with pip where uv cannot be had. Bytecode is
# compiled at install, as pip does: left to the first import, a process with a capped file size (the disk-fault
# tests) could write a truncated .pyc into the venv.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q torch==2.13.0; fi
	$(PIP) install -q uv && $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e '.[dev]' || $(PIP) install -q -e '.[dev]'
	touch $(STAMP)

pipeline: install
	$(VENV)/bin/torchship run

# promtool (alert-rule tests) and prometheus (bench/bench_dashboard.py) come with Debian's `prometheus` package.
prometheus:
	$(call apt_install,promtool:prometheus) || echo "Debian's prometheus package could not be installed: the promtool tests skip (they fail where CI=true)"

# `torchship stack` and tests/integration/test_stack.py: Debian's PostgreSQL server (moto, the database drivers and
# MLflow's auth app come with the dev extra). A part still missing afterwards fails here under CI=true; elsewhere the
# test skips and names what is missing.
stack-deps: install
	ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1; \
		apt-get install -y -qq postgresql >/dev/null 2>&1; } || true
	for part in /usr/lib/postgresql/*/bin/pg_ctl $(VENV)/bin/moto_server; do [ -x "$$part" ] && continue; \
		echo "$$part is missing: \`torchship stack\` and its test need Debian's postgresql and moto[server]"; \
		[ "$$CI" != true ] || exit 1; done

# ruff with the rules pyproject.toml selects (import order, line length, bugbear, pyupgrade, simplify)
lint: install
	$(VENV)/bin/ruff check .

test: install prometheus stack-deps lint
	$(VENV)/bin/python -m pytest -q $(XDIST) --durations=15

# In-memory suites, CPU-bound: two workers on two cores, each test sent where there is room (--dist load). Named by
# folder, not by marker: a marker would still make each worker import every integration module to deselect it, and
# none of these folders uses the property-testing plugins (hypothesis, schemathesis: ~4 s of imports a worker).
test-fast: install prometheus lint
	$(VENV)/bin/python -m pytest -q -n 2 -p no:hypothesispytest -p no:schemathesis tests/unit tests/data tests/model

# Every bench but the per-table accuracy one and the sweep's (below: each takes over an hour on 2 cores).
bench: install stack-deps
	$(call apt_install,promtool:prometheus wrk:wrk) || echo "prometheus or wrk could not be installed: bench/bench_dashboard.py and bench/bench_serving.py need them"
	for script in bench/bench_*.py; do case $$script in bench/bench_tables.py|bench/bench_sweep.py) continue;; esac; \
		$(PY) $$script || exit 1; done
	$(PY) bench/render_table.py

# The served model vs the cross-validation-picked scikit-learn baseline, 8 public tables, 10 seeds under 1,000 rows and
# 3 above, the stage cores in process (an estimated 1.5-2 hours on 2 quiet cores: iris took 53 s a seed).
# Installs the bench extra (palmerpenguins, statsmodels). Fewer: $(PY) bench/bench_tables.py --tables iris,wine --small-seeds 2
bench-tables: install
	$(PIP) install -q -e '.[dev,bench]'
	$(PY) bench/bench_tables.py
	$(PY) bench/render_table.py

# Studies of 12 trials over 5 seeds on fair, anes96, digits and images:digits, and the workers' trials per hour (about
# 90 min on 2 cores; the bench extra for the tables). Fewer: $(PY) bench/bench_sweep.py --sets fair --seeds 2 --trials 4
bench-sweep: install
	$(PIP) install -q -e '.[dev,bench]'
	$(PY) bench/bench_sweep.py
	$(PY) bench/render_table.py

docs: install
	$(VENV)/bin/torchship config-docs

clean:
	$(VENV)/bin/torchship clean
