# Two commands set everything up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Modules type-checked in strict mode (the pure cores and the typed public packages).
CORES := daemon sdk webui_model benchmarks
STAMP := $(VENV)/.installed

.PHONY: viewer-protocol serve demo test test-deep unit-fast test-stress test-agents check unit bench bench-quick mutation \
	clean chaos-cluster chaos-prompts

# A new version reinstalls too: the installed metadata carries it. The venv's own pip installs
# the project as it is (no upgrade of pip first: one index look-up and install less).
$(STAMP): pyproject.toml sdk/protocol/_version.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

serve: $(STAMP)
	$(PY) -m daemon $(ARGS)

# A throw-away daemon with tiny live-journal caps: a truncated live turn and its repair, printed.
demo: $(STAMP)
	$(PY) -m webui_model.demo $(ARGS)

# daemon/ui/protocol.js, the viewer's wire names, written from the Python protocol (a test holds
# the committed file equal to it).
viewer-protocol: $(STAMP)
	$(PY) -c "import sys; from webui_model.viewer_protocol import render; sys.stdout.write(render())" \
		> daemon/ui/protocol.js

# Lint + strict types on the pure cores, then the whole suite, then the benchmark smoke run.
LINT := $(VENV)/bin/ruff check daemon sdk webui_model tests benchmarks
TYPES := $(VENV)/bin/mypy --strict $(CORES)
check: $(STAMP)
	$(LINT)
	$(TYPES)

# The viewer's browser tests drive Debian's chromium through Playwright (its pip wheel brings the
# driver; no browser download). Installed here when missing and run as root; otherwise those
# tests are skipped with the reason. The stamp is only written once chromium is there.
BROWSER_STAMP := $(VENV)/.chromium
$(BROWSER_STAMP): $(STAMP)
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } || \
		echo "note: apt-get install chromium failed"
	@if command -v chromium >/dev/null; then touch $@; else \
		echo "note: chromium is not installed, the browser tests will be skipped (apt-get install chromium)"; fi

# The cluster-mode tests start real redis-server processes (Debian's redis-server package, which
# brings redis-cli too). Installed here when missing and run as root; otherwise those tests are
# skipped with the reason. The stamp is only written once redis-server is there.
REDIS_STAMP := $(VENV)/.redis
$(REDIS_STAMP): $(STAMP)
	@command -v redis-server >/dev/null || [ "$$(id -u)" != 0 ] || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; } || \
		echo "note: apt-get install redis-server failed"
	@if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then touch $@; else \
		echo "note: redis-server is not installed, the cluster tests will be skipped (apt-get install redis-server)"; fi

# The project's modules are byte-compiled first: every daemon, agent and CLI process the tests
# start imports them, and where PYTHONDONTWRITEBYTECODE is set each would compile them from
# source again (~0.2 s of CPU per daemon start).
BYTECODE := $(PY) -m compileall -q daemon sdk webui_model benchmarks tests >/dev/null

# pytest's assertion-rewritten test modules, written once: pytest caches them only where bytecode
# may be written, and otherwise every xdist worker rewrites all of them again while it collects
# (most of its collection's CPU). A collection run without PYTHONDONTWRITEBYTECODE writes them;
# not when PYTEST_ARGS picks what to run (a few files are rewritten quickly enough).
REWRITTEN := $(if $(PYTEST_ARGS),true,env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q \
	-p no:cacheprovider --collect-only >/dev/null)

# xdist workers: one and a half per core. A worker spends part of its time waiting on the
# daemons, agents and timers its tests start (its daemons start from a zygote,
# tests/harness_zygote.py, so little of their CPU is start-up); half a worker more per core fills
# that wait, while a whole one more only adds its own start-up and contention. worksteal hands
# each worker a contiguous run of tests (a module's shared daemon starts once) and rebalances
# only at the end; tests/conftest.py lays the collection out so that each worker's run starts
# with its share of the long modules (tests/scheduling.py), leaving short tests for the end.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n + (n + 1) / 2 )))
XDIST := -n $(TEST_WORKERS) --dist worksteal

PYTEST := $(PY) -m pytest -q -p no:cacheprovider $(XDIST) $(PYTEST_ARGS)

unit: $(STAMP) $(BROWSER_STAMP) $(REDIS_STAMP)
	$(BYTECODE)
	$(REWRITTEN)
	$(PYTEST)

# `make check` then `make unit`: mypy (one core) and ruff run beside the byte-compiling and the
# collection run that writes the rewritten test modules (the other core); the step fails if any
# of them failed, once all have ended. Then the suite (see XDIST and tests/scheduling.py).
test: $(STAMP) $(BROWSER_STAMP) $(REDIS_STAMP)
	$(TYPES) & types=$$!; $(LINT) & lint=$$!; \
		$(BYTECODE) && $(REWRITTEN); prepared=$$?; \
		wait $$lint; linted=$$?; wait $$types; typed=$$?; \
		test $$prepared = 0 && test $$linted = 0 && test $$typed = 0
	$(PYTEST)

# The whole suite with four times the property tests' examples (HYPOTHESIS_PROFILE=deep,
# tests/hypothesis_profiles.py; `make test` runs the ci profile). Not part of `make test`.
test-deep: $(STAMP) $(BROWSER_STAMP) $(REDIS_STAMP)
	$(BYTECODE)
	HYPOTHESIS_PROFILE=deep $(PY) -m pytest -q -p no:cacheprovider $(XDIST) $(PYTEST_ARGS)

# The tests that start no process (pytest.mark.processes marks those that do; tests/conftest.py
# fails an unmarked test that starts one), with a few hypothesis examples each: a quick pass
# while editing. Not a substitute for `make test`.
unit-fast: $(STAMP)
	$(BYTECODE)
	HYPOTHESIS_PROFILE=fast $(PY) -m pytest -q -p no:cacheprovider -n 2 -m "not processes" $(PYTEST_ARGS)

# The cluster fault suite (tests/cluster/test_cluster_faults.py, part of `make test` once) run again and
# again: TK_CHAOS_ROUNDS rounds of every fault (default 10). Not part of `make test`.
TK_CHAOS_ROUNDS ?= 10
chaos-cluster: $(STAMP) $(REDIS_STAMP)
	TK_CHAOS_ROUNDS=$(TK_CHAOS_ROUNDS) $(PY) -m pytest -q -p no:cacheprovider -n 2 \
		tests/cluster/test_cluster_faults.py $(PYTEST_ARGS)

# The exactly-once proof (tests/sdk/test_prompt_exactly_once.py: 200 prompts in `make test`) at a
# larger scale: TK_PROMPT_CHAOS_CALLS prompts (default 1000) under the plan of seed
# TK_PROMPT_CHAOS_SEED (default 41). Not part of `make test`.
TK_PROMPT_CHAOS_CALLS ?= 1000
TK_PROMPT_CHAOS_SEED ?= 41
chaos-prompts: $(STAMP)
	TK_PROMPT_CHAOS_CALLS=$(TK_PROMPT_CHAOS_CALLS) TK_PROMPT_CHAOS_SEED=$(TK_PROMPT_CHAOS_SEED) \
		$(PY) -m pytest -q -p no:cacheprovider -s tests/sdk/test_prompt_exactly_once.py \
		-k every_prompt $(PYTEST_ARGS)

# The whole suite three times in a row while another process keeps one CPU busy (tests/stress.sh):
# proves no test depends on how fast or idle the machine is. Not part of `make test`.
test-stress: $(STAMP)
	PY=$(PY) XDIST="$(XDIST)" tests/stress.sh

# The agent matrix (not part of `make test`): installs the popular ACP agents at pinned versions
# from npm and PyPI into .agents-cache/ (kept between runs), then runs each behind a real daemon
# against the fake model servers in tests/agent_matrix/, in a network namespace with loopback
# only where the machine allows one, and prints a table of which steps each passed.
# AGENTS="opencode gemini-cli" runs a selection (names in tests/agent_matrix/agents.py).
test-agents: $(STAMP)
	$(PY) -m tests.agent_matrix.install $(AGENTS)
	rm -rf .agents-cache/results
	$(PY) -m tests.agent_matrix.offline $(PY) -m pytest -p no:cacheprovider -q \
		tests/agent_matrix/scenario.py $(if $(AGENTS),-k "$(shell echo $(AGENTS) | sed 's/ / or /g')") \
		$(PYTEST_ARGS); status=$$?; $(PY) -m tests.agent_matrix.scenario; exit $$status

bench: $(STAMP)
	$(PY) -m benchmarks $(ARGS)

# Mutation testing of the pure cores, module by module against their fast unit tests (not part
# of `make test`; takes a while). Workspaces, logs and the score table go to .mutation/.
# MUTATION_ARGS: e.g. `daemon/core/envelope.py --workers 2 --show-survivors`.
$(VENV)/.mutation-installed: $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,mutation]'
	touch $@

mutation: $(VENV)/.mutation-installed
	$(PY) tests/mutation.py $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
