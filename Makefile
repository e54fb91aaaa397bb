# `make demo` and `make test` build .venv from a Python 3.12 interpreter when it is missing.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test clean venv

$(VENV)/.installed: pyproject.toml
	@set -e; \
	if [ ! -x $(PY) ]; then \
	  interp=""; \
	  for c in python3.12 "$$(pyenv root 2>/dev/null)/versions/3.12"*/bin/python $$HOME/.pyenv/versions/3.12*/bin/python python3; do \
	    if "$$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; then interp="$$c"; break; fi; \
	  done; \
	  if [ -z "$$interp" ]; then \
	    echo "error: no Python 3.12 interpreter found on PATH or under pyenv (tried python3.12, pyenv versions 3.12.*, python3)" >&2; exit 1; \
	  fi; \
	  echo "creating $(VENV) with $$interp"; \
	  "$$interp" -m venv $(VENV); \
	fi
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,eval]"
	@touch $@

venv: $(VENV)/.installed

DEMO := runs/demo
DEMO_CONFIG := experiments/configs/mqar.py:demo

# A tiny GDN-2 on MQAR: train 150 steps and stop, resume to the end (300), evaluate the checkpoint.
demo: $(VENV)/.installed
	rm -rf $(DEMO)
	$(PY) -m experiments.train --config=$(DEMO_CONFIG) --workdir=$(DEMO) --stop_after=150
	$(PY) -m experiments.train --config=$(DEMO_CONFIG) --workdir=$(DEMO)
	$(PY) -m experiments.eval --workdir=$(DEMO)
	@echo "demo run in $(DEMO): checkpoints/, metrics.jsonl, metrics.png (loss/accuracy plot), eval.json, config.json"

test: $(VENV)/.installed
	$(PY) -m pytest -q -n 2 -m "not slow" --durations=25 tests

clean:
	rm -rf $(VENV)
