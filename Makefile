# Fresh-machine entry points (see README). Everything installs into .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA_DIR ?= ./ferrymq-data

.PHONY: setup standalone test lint bench helm clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[operator,pipeline,dev]'
	touch $(STAMP)

setup: $(STAMP)

## start the embedded default (controller + one broker) on 127.0.0.1:8080
standalone: setup
	$(BIN)/ferrymq standalone --data-dir $(DATA_DIR) --flush sync

## system packages the tests use (etcd for the controller store, Java for Spark, helm)
system-deps:
	bash scripts/install-system-deps.sh

helm: setup
	bash scripts/install-helm.sh

## the whole test suite, lint included
test: setup system-deps helm
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -rs

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python -m bench.store_bench
	$(BIN)/python -m bench.http_bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

## FerryMQ side by side with Redis Streams, NATS JetStream and RabbitMQ (installs them: root for apt-get);
## quick run: make bench-peers PEERS_ARGS="--peers redis,ferrymq-sync --messages 20000"
.PHONY: bench-peers
bench-peers: setup
	$(BIN)/python -m bench.peers $(PEERS_ARGS)
