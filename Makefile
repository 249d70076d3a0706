# The two commands: `make demo` and `make test`. Everything else supports them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install kafka check unit bench clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "streamloop needs Python 3.11+, found " + sys.version.split()[0] + " (set PYTHON=python3.11)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test,monitor,spark]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m engine.demo

kafka: $(STAMP)
	$(BIN)/python -m tests.support.kafka_broker fetch

# Static checks: the typed public API stays typed, and no name is left unused or undefined.
check: $(STAMP)
	$(BIN)/python -m mypy engine handlers
	$(BIN)/python -m ruff check engine handlers tests benchmarks

# The session fixture starts the Kafka broker (fetched above) and stops it at the end.
test: kafka check
	$(BIN)/python -m pytest -q

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit tests/properties

bench: kafka
	$(BIN)/python benchmarks/stateless_pipeline.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
