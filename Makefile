# gradleak: two commands on a fresh machine.
#   make demo   set up .venv (pinned) and run the main job: `gradleak attack` (attack auto) on one real CIFAR-10 photo
#   make test   set up .venv, lint (ruff, import contracts) and run the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.gradleak-stamp
# Fashion-MNIST (and strace, for the loopback test) from Debian's registry, no root needed; as
# root also Debian's chromium, for the dashboard's browser test (skipped without it).
DATA := $(VENV)/share/gradleak
DATA_STAMP := $(DATA)/.provisioned

.PHONY: setup demo test bench clean

setup: $(STAMP) $(DATA_STAMP)

# Rebuilt only when the pins or the package metadata change.
$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch 2.14.1 / torchvision 0.29.1 come from this machine's local wheels via pip.
	$(BIN)/python -m pip install -q -c requirements.lock -e ".[pretrained,test,fl,text]"
	# foolbox is installed only for the real sample photos in foolbox/data/; its own
	# dependencies (eagerpy, ...) are not needed because gradleak never imports it.
	$(BIN)/python -m pip install -q --no-deps foolbox==3.3.4
	touch $(STAMP)

# The loader looks in $(DATA)/fashion-mnist (sys.prefix/share/gradleak), then Debian's folder.
$(DATA_STAMP): scripts/provision.sh $(STAMP)
	bash scripts/provision.sh $(DATA)
	touch $(DATA_STAMP)

demo: setup
	$(BIN)/gradleak attack

test: setup
	$(BIN)/ruff check src tests
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n 2

bench: setup
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) runs .pytest_cache
