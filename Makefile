# Two commands do all the set-up on a fresh machine: `make train` and `make test`.
# `make test` is the whole suite (CI runs it after `make lint`, ruff's checks); `make test-fast` leaves out the tests marked `slow`
# (trainings, Launchpad launches, XLA compiles of the zoo, the wheel) and takes under a minute.
# Both create .venv (CPython 3.10) from the pinned requirements first; `make setup` alone
# is idempotent and returns in seconds when requirements, constraints and pyproject are unchanged.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.malloczero-installed
# pip warns about every missing local mirror folder on these machines; keep real errors visible.
PIP_QUIET := 2>&1 | { grep -v -e "is ignored: it is neither a file nor a directory" || true; }
PYTEST_ARGS ?=
# Test workers (pytest-xdist): the CI machine's 2 cores. The Launchpad launches run in turn on one
# worker (tests/test_distributed.py); the shared tiny training run is trained once (tests/conftest.py).
TEST_WORKERS ?= 2
# make train: the Launchpad program (one process per node, 2 actors) with the small config on the
# default suite, stopping itself after 9 minutes of training plus the final evaluation (~10 min).
TRAIN_ARGS ?= --launch local_mp --config small --num-actors 2 --max-seconds 540

.PHONY: setup lint test test-fast train bench clean-venv
setup: $(STAMP)

$(STAMP): requirements.txt constraints.txt pyproject.toml scripts/find_python310.sh
	@python310=$$(scripts/find_python310.sh); \
	if [ ! -x $(PY) ] || ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))'; then \
	  echo "setup: creating $(VENV) with $$python310"; rm -rf $(VENV); "$$python310" -m venv $(VENV); \
	fi
	@echo "setup: installing pinned requirements (first run takes about a minute)"
	@$(PY) -m pip install -q -r requirements.txt -c constraints.txt $(PIP_QUIET)
	@$(PY) -m pip install -q dm-acme==0.4.0 --no-deps $(PIP_QUIET)
	@$(PY) -m pip install -q --no-deps --no-build-isolation -e . $(PIP_QUIET)
	@$(PY) -c "import launchpad, reverb, jax, haiku, mctx, acme, malloczero.launch.cli" || { echo "setup: the installed stack does not import; see above" >&2; exit 1; }
	@touch $(STAMP)
	@echo "setup: done ($(VENV) ready)"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: setup
	@rc=0; $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

test-fast: setup
	@rc=0; $(PY) -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "test-fast: pytest collected no tests" >&2; exit 1; fi; exit $$rc

train: setup
	$(VENV)/bin/malloczero train $(TRAIN_ARGS)

bench: setup
	$(VENV)/bin/malloczero bench --out bench.json

clean-venv:
	rm -rf $(VENV)
