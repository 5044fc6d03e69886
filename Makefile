# The two commands of README.md: `make demo` and `make test`. Each sets up .venv on
# a fresh machine. torch is pinned and installed first, from the CPU wheel on disk,
# so that pip never resolves (and downloads) another build of it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
SWORD_PACKAGES := sword-text-web sword-text-sparv sword-text-kjv

# Folders ruff looks at (benchmarks/ may not exist yet).
CODE := $(wildcard src tests benchmarks)

.PHONY: demo test lint format install sword clean bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[test,hf]"
	touch $@

install: $(VENV)/.installed

# The Bible corpus comes from Debian's SWORD modules. Installed when we are root;
# otherwise the exact command is printed and the data tests skip with a reason.
sword:
	@if ls /usr/share/sword/modules/texts/ztext/engWEB2015eb >/dev/null 2>&1 \
	    && ls /usr/share/sword/modules/texts/ztext/spaRV1909eb >/dev/null 2>&1 \
	    && ls /usr/share/sword/modules/texts/ztext/engKJV2006eb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q $(SWORD_PACKAGES) >/dev/null 2>&1 \
	     || (apt-get update -q >/dev/null && apt-get install -y -q $(SWORD_PACKAGES) >/dev/null)) \
	    || echo "warning: could not install $(SWORD_PACKAGES)"; \
	else \
	    echo "The Bible corpus needs: sudo apt-get install $(SWORD_PACKAGES)"; \
	fi

demo: install
	$(BIN)/aiayn quickstart

lint: install
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)

format: install
	$(BIN)/ruff check --fix $(CODE)
	$(BIN)/ruff format $(CODE)

test: install lint sword
	$(BIN)/python -m pytest -n 2 -q

# Speed against the peers (README, "Speed"); QUICK=1 for fewer rounds.
bench: install
	$(BIN)/pip install --quiet -e ".[test,hf,bench]" "$(TORCH)"  # torch stays pinned
	PYTHONPATH=src $(BIN)/python benchmarks/bench_decode.py $(if $(QUICK),--quick)
	PYTHONPATH=src $(BIN)/python benchmarks/bench_train.py $(if $(QUICK),--quick)
	PYTHONPATH=src $(BIN)/python benchmarks/bench_attention.py $(if $(QUICK),--quick)

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
