# The two commands: `make demo` and `make test`. Everything else supports them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH  := $(VENV)/.bench-installed

.PHONY: demo test test-slow install kafka check docs unit bench bench-quick clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "streamloop needs Python 3.11+, found " + sys.version.split()[0] + " (set PYTHON=python3.11)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test,rocksdb,monitor,prometheus,http,docs,spark,schema-registry,otel]'
	@touch $(STAMP)

# The benchmark peers (faust-streaming, quixstreams) and matplotlib, only for `make bench`.
$(BENCH): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,rocksdb,monitor,prometheus,http,docs,spark,schema-registry,otel,bench]'
	@touch $(BENCH)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m streamloop.demo

kafka: $(STAMP)
	$(BIN)/python -m tests.support.kafka_broker fetch

# Static checks: mypy --strict and ruff's broader rule set (both configured in pyproject.toml),
# and the documentation site builds without a warning (broken link, missing page, bad docstring).
check: $(STAMP) docs
	$(BIN)/python -m mypy -p streamloop
	$(BIN)/python -m ruff check engine handlers tests benchmarks

# Not --quiet: mkdocs 1.6 drops the warnings it hides before --strict counts them.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# Parallel workers share one Kafka broker (fetched above), started and stopped by pytest's
# controller (tests/conftest.py); the tests wait on brokers and rebalances far more than they compute.
TEST_WORKERS ?= 3
test: kafka check
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The long fault runs (a Spark worker killed mid-job, ...), left out of `make test`, and the
# costly property tests with three times their examples.
test-slow: kafka $(STAMP)
	$(BIN)/python -m pytest -q -m slow
	STREAMLOOP_EXAMPLES_SCALE=3 $(BIN)/python -m pytest -q tests/properties

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit tests/properties

# streamloop against raw aiokafka, faust-streaming, quixstreams and Kafka Streams on one broker;
# writes docs/benchmarks.md and docs/benchmarks.png; then the tables of issue #34 (the DSL against
# Kafka Streams, latency at 50% and 80% of each one's peak, window-store expiry, records in flight),
# printed. Run it on a quiet machine: it takes about an hour.
bench: kafka $(BENCH)
	$(BIN)/python benchmarks/compare.py
	$(BIN)/python benchmarks/compare.py --peers streamloop,kafka-streams \
		--workloads suppress,session,table-join,fk-join,join --records 200000 --runs 1 \
		--latency-seconds 0 --warmup 0.3 --no-docs
	$(BIN)/python benchmarks/latency_load.py
	$(BIN)/python benchmarks/window_segments.py
	$(BIN)/python benchmarks/in_flight.py --levels 32,256 --records 1000 --max-records 24000 --no-faust

bench-quick: kafka $(BENCH)
	$(BIN)/python benchmarks/compare.py --quick --no-docs

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis site
