# `make train` and `make test` build .venv on first use, with the fbgemm variant that fits this machine.
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# cuda when a GPU is visible to nvidia-smi, cpu otherwise; override with `make VARIANT=cpu ...`.
VARIANT ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
STAMP := $(VENV)/.installed-$(VARIANT)
PYTEST_ARGS ?=
# `make test`: the tests and the benchmark smoke tests in one session (-m '' lifts pyproject's
# "not benchmark"), so that the two workers share one start and one tail. Line coverage is left out (it more
# than doubles the in-process planner tests, past CI's 20 minutes): `make test PYTEST_ARGS=--cov` measures it.
# pytest workers: three keep both cores busy while tests wait on imports, files or their other rank
# (the whole of `make test` took 16m16s here with three, 18m10s with two; on a slower day 21m07s with
# three, 23m02s with four). This machine's speed varies by about 20% between runs: compare commits in turns.
TEST_WORKERS ?= 3

.PHONY: train test lint clean

$(STAMP): pyproject.toml requirements/*.txt
	rm -rf $(VENV)
	python3 -m venv $(VENV)
	$(PIP) install --quiet -r requirements/base.txt -r requirements/$(VARIANT).txt -r requirements/dev.txt
	$(PIP) install --quiet --no-deps -r requirements/torchrec.txt
	$(PIP) install --quiet --no-deps -e .
	touch $(STAMP)

train: $(STAMP)
	$(PY) examples/train_dlrm_fae.py --eval-every 50 --out runs/train

test: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) runs
