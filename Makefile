# Two commands do all the set-up: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8080
ARGS ?=

.PHONY: install serve test lint clean browser

install: $(STAMP)

# torch: the CPU build pinned below on a fresh machine; an existing torch
# (a GPU image's) is kept because the venv sees the system site-packages.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# --draft auto drafts with the checkpoint's MTP head when its folder has one (the bundled demo's
# model-mtp.safetensors), else serves plain and says so; ARGS that name --draft choose themselves.
DRAFT ?= $(if $(findstring --draft,$(ARGS)),,--draft auto)

serve: $(STAMP)
	$(VENV)/bin/tensorfold serve --host $(HOST) --port $(PORT) $(DRAFT) $(ARGS)

# Two workers (CI's two cores); an idle worker takes queued tests from the busy one.
test: $(STAMP) browser lint
	$(PY) -m pytest -q -n 2 --dist worksteal $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# tests/test_web_page.py drives Debian's chromium (through Playwright, never its own download).
# Installed here when missing, where apt-get may run as root; otherwise that test is skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    echo "installing chromium (apt-get) for the browser test" && \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      chromium fonts-dejavu-core >/dev/null; } || \
	  echo "chromium is not installed: the browser test will be skipped"

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info src/*.egg-info
