# Two commands do all the set-up: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8080
ARGS ?=

.PHONY: install serve test clean

install: $(STAMP)

# torch: the CPU build pinned below on a fresh machine; an existing torch
# (a GPU image's) is kept because the venv sees the system site-packages.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/tensorfold serve --host $(HOST) --port $(PORT) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info src/*.egg-info
