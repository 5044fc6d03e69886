# The two commands of README.md: `make demo` and `make test` (and `make docs`, the site).
# Each sets up .venv on a fresh machine. torch is pinned and installed first, from the
# CPU wheel on disk, so that pip never resolves (and downloads) another build of it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
SWORD_PACKAGES := sword-text-web sword-text-sparv sword-text-kjv
BROWSER_PACKAGES := chromium chromium-driver fonts-nanum  # Hangul, for the Korean docs' screenshots
ALLOCATOR_PACKAGE := libjemalloc2  # training's malloc (aiayn.training.host_memory)

# Folders ruff looks at (benchmarks/ may not exist yet; docs/hooks: the site's build code).
CODE := $(wildcard src tests benchmarks docs/hooks)

.PHONY: demo test audit-cpus lint format install sword browser allocator clean bench release-reference docs docs-serve

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Bytecode is compiled after the installs, on every core (pip compiles file by file on
# one: 160 s against 115 s in all on 2 cores). The few files written for a newer Python
# (torch's py312 tests) do not compile, as under pip; they are never imported.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --no-compile $(TORCH)
	$(BIN)/pip install --quiet --no-compile -e ".[test,hf]"
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	touch $@

install: $(VENV)/.installed

# The Bible corpus comes from Debian's SWORD modules. Installed when we are root, and a
# failed install stops here with the reason; otherwise the exact command is printed and
# the data tests skip with a reason (under CI=true that stops here too: CI must run them).
SWORD_DIR := /usr/share/sword/modules/texts/ztext
sword:
	@if ls $(SWORD_DIR)/engWEB2015eb >/dev/null 2>&1 \
	    && ls $(SWORD_DIR)/spaRV1909eb >/dev/null 2>&1 \
	    && ls $(SWORD_DIR)/engKJV2006eb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q $(SWORD_PACKAGES) >/dev/null 2>&1 \
	     || (apt-get update -q >/dev/null && apt-get install -y -q $(SWORD_PACKAGES) >/dev/null)) \
	    || { echo "error: apt-get could not install $(SWORD_PACKAGES) (its message is above);" \
	              "the quickstart and Bible tests need them" >&2; exit 1; }; \
	elif [ "$$CI" = true ]; then \
	    echo "error: CI=true needs the Bible corpus: run as root or sudo apt-get install $(SWORD_PACKAGES)" >&2; \
	    exit 1; \
	else \
	    echo "The Bible corpus needs: sudo apt-get install $(SWORD_PACKAGES)"; \
	fi

# The explorer's browser test drives Debian's headless Chromium (nothing is downloaded at
# run time). Installed when we are root; otherwise that test skips with this line. Under
# CI=true a browser that cannot be installed stops here (CI must run that test).
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q $(BROWSER_PACKAGES) >/dev/null 2>&1 \
	     || (apt-get update -q >/dev/null && apt-get install -y -q $(BROWSER_PACKAGES) >/dev/null)) \
	    || if [ "$$CI" = true ]; then \
	        echo "error: CI=true needs the browser test: apt-get could not install" \
	             "$(BROWSER_PACKAGES) (its message is above)" >&2; exit 1; \
	    else \
	        echo "warning: could not install $(BROWSER_PACKAGES); the browser test will skip"; \
	    fi; \
	elif [ "$$CI" = true ]; then \
	    echo "error: CI=true needs the browser test: run as root or sudo apt-get install $(BROWSER_PACKAGES)" >&2; \
	    exit 1; \
	else \
	    echo "The browser test needs: sudo apt-get install $(BROWSER_PACKAGES)"; \
	fi

# Training runs with jemalloc where it is installed (aiayn.training.host_memory): on the
# quickstart's recipe, with the raised kernel cache, it made 1.63x the updates a minute of
# PyTorch's and glibc's defaults (benchmarks/results/host-memory.json). Installed
# when we are root; otherwise training keeps glibc's malloc (tuned) and says so in its log.
# Under CI=true it must be there: its test checks the restart with it.
allocator:
	@if { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q 'libjemalloc\.so\.2'; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q $(ALLOCATOR_PACKAGE) >/dev/null 2>&1 \
	     || (apt-get update -q >/dev/null && apt-get install -y -q $(ALLOCATOR_PACKAGE) >/dev/null)) \
	    || if [ "$$CI" = true ]; then \
	        echo "error: CI=true needs $(ALLOCATOR_PACKAGE): apt-get could not install it" >&2; exit 1; \
	    else \
	        echo "warning: could not install $(ALLOCATOR_PACKAGE); training keeps glibc's malloc"; \
	    fi; \
	elif [ "$$CI" = true ]; then \
	    echo "error: CI=true needs $(ALLOCATOR_PACKAGE): run as root or sudo apt-get install $(ALLOCATOR_PACKAGE)" >&2; \
	    exit 1; \
	else \
	    echo "Training runs faster with jemalloc: sudo apt-get install $(ALLOCATOR_PACKAGE)"; \
	fi

demo: install sword allocator
	$(BIN)/aiayn quickstart

lint: install
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)

format: install
	$(BIN)/ruff check --fix $(CODE)
	$(BIN)/ruff format $(CODE)

# The tests that train a model and assert on the outcome (marked `trains`, the docs pages
# among them) run a second time under another CPU's kernels: PyTorch's and oneDNN's code of
# another SIMD width than this machine's own (AVX2 on an AVX-512 CPU; below AVX2 on an
# AVX2 one: tests/variants/kernels.py), so a claim that holds on one CPU's float sums only
# fails here, not on a learner's laptop.
test: install lint sword browser allocator
	$(BIN)/python -m pytest -n 2 -q
	env $$($(BIN)/python tests/variants/kernels.py) $(BIN)/python -m pytest -n 2 -q -m trains

# The portability audit: the `trains` tests under 3 seeds and both kernel sets, a table of
# pass/fail (long: about six times the marked tests).
audit-cpus: install sword
	$(BIN)/python tests/variants/audit.py --out audit-cpus.md

# The docs site (mkdocs.yml): built into site/, or served at http://127.0.0.1:8000 while
# you edit. `make test` builds it too (--strict, tests/docs/test_docs_site.py).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

# Speed against the peers (docs/explanation/results/speed.md); QUICK=1 for fewer rounds.
bench: install
	$(BIN)/pip install --quiet -e ".[test,hf,bench]" "$(TORCH)"  # torch stays pinned
	$(BIN)/python -m benchmarks.bench_decode $(if $(QUICK),--quick)
	$(BIN)/python -m benchmarks.bench_train $(if $(QUICK),--quick)
	$(BIN)/python -m benchmarks.bench_attention $(if $(QUICK),--quick)

# The release step: the quickstart's packaged reference line from the recorded runs in
# benchmarks/results/ (no benchmark writes into src/).
release-reference: install
	$(BIN)/python -m benchmarks.release

clean:
	rm -rf $(VENV) build dist site src/*.egg-info .pytest_cache .ruff_cache
