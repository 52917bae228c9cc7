# Both entry points bootstrap .venv themselves: a fresh clone needs only python3 (>= 3.11).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck pytest fuzz system-packages engine bench bench-swaps bench-cluster clean
PEERS ?=
# `make run ENGINE=llama.cpp`: the demo with two real llama-cpp-python servers;
# `make run ENGINE=llama-server`: with llama.cpp's own llama-server in router mode;
# `make run ENGINE=llama-swap`: two real llama-swap instances running llama-server.
ENGINE ?=

run: $(STAMP)
ifeq ($(ENGINE),)
	$(BIN)/swapgate demo --config config/demo.yaml
else
	$(BIN)/swapgate demo --engine $(ENGINE)
endif

test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/mypy --config-file pyproject.toml --check-untyped-defs tests bench

# Five workers, one test file each at a time: most e2e time is spent waiting on real processes
# (swaps, timeouts, engine starts), and the files that compute are spread over the run
# (tests/conftest.py), so five files in parallel keep two cores busy (1,057 tests: 366 s
# against 393 s with four workers, one run each, on 2 cores). The suite starts hundreds of
# Python processes (gateways, simulators): its modules are compiled once here, so that none
# compiles them again where PYTHONDONTWRITEBYTECODE is set. Each worker collects every test,
# and pytest rewrites each test module's asserts as it imports it; with that variable set it
# never keeps the result, and each worker spent 7 of its 11 CPU-seconds of collection doing it
# again. One collection beside the compile keeps them (workers read them, set or not), and
# writes hypothesis's caches, which each worker of a fresh clone built anew (tests/conftest.py).
PYTEST_WORKERS ?= 5
# Branch coverage of what the unit tests run in the test processes (the e2e and engine tests'
# gateways run in processes of their own and are not counted; those tests and the property
# tests run untraced, tests/conftest.py): printed after the run, and
# `make test` fails under COVERAGE_FLOOR. Raise it as it rises: the placement crash of a full
# fleet (CHANGELOG) sat in a line no test reached.
COVERAGE_FLOOR ?= 83
pytest: $(STAMP) system-packages engine
	$(BIN)/python -m compileall -q swapgate testbed tests bench & \
		env -u PYTHONDONTWRITEBYTECODE SWAPGATE_WARM_HYPOTHESIS=1 \
		$(BIN)/pytest --collect-only -q >/dev/null; wait
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--cov=swapgate --cov-branch --cov-report=
	@printf 'branch coverage, in-process: %s%% (floor %s%%)\n' \
		"$$($(BIN)/coverage report --format=total)" "$(COVERAGE_FLOOR)"
	$(BIN)/coverage report --format=total --fail-under=$(COVERAGE_FLOOR) >/dev/null

# The control plane's randomized state machine (tests/unit/control/test_fleet_states.py) over
# FUZZ_EXAMPLES random fleets and runs of steps instead of the suite's 200, every invariant
# checked after every step (5,000: ~4.5 min on 2 cores; a failure's shrinking up to 5 more). A
# failure it finds is kept in .hypothesis/ and replayed first by later runs of the test.
FUZZ_EXAMPLES ?= 5000
fuzz: $(STAMP)
	SWAPGATE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest -p no:logging \
		--hypothesis-show-statistics tests/unit/control/test_fleet_states.py

# The real engines the tests run: llama-cpp-python and llama.cpp's llama-server with
# Gemma-3-270M, vLLM's CPU build with a tiny Llama made offline, the coding clients, and MLflow
# (the trace backend the tracing tests read); built once per machine into ~/.cache/swapgate (or
# $$SWAPGATE_ENGINE_CACHE), outside .venv; ~5.5 + ~7 + ~2 + ~2 min the first time on 2 cores,
# about a second once cached.
engine: $(STAMP)
	$(BIN)/python -m testbed

system-packages:
	bash .ci/ensure-packages

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Measures swapgate against direct, a bare passthrough (and PEERS=litellm); writes docs/benchmarks.md.
# Then the costs of fleets of 4 to 256 simulated instances (~3 minutes, bench/fleet.py).
bench: $(STAMP) system-packages
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(BIN)/python -m bench --peers "$(PEERS)"
	$(BIN)/python -m bench.fleet

# Replays seeded traces: swap counts against the optimum, LRU and round-robin (~10 minutes),
# then the same traces on vllm-sleep instances beside llama-swap ones (~2 minutes), then one day
# at 1, 5 and 30 s swaps under default and hand-tuned timing (~22 minutes, side by side).
bench-swaps: $(STAMP)
	$(BIN)/python -m bench.swaps
	$(BIN)/python -m bench.tiers
	$(BIN)/python -m bench.tuning

# The warm path of a replica on Redis against one alone (needs redis-server; ~1 minute).
bench-cluster: $(STAMP) system-packages
	$(BIN)/python -m bench.cluster

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
