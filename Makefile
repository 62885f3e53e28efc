# The two commands of the README. Each sets up .venv on first use (torch 2.14.1 comes from local disk
# on our machines; elsewhere pip downloads it).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: run test check gpu-check

# What `make run` uses: torch and the project. The test extras (pytest, schemathesis, playwright, Ray, ruff, mypy)
# come on top for `make test`, `make check` and `make gpu-check` (.kernelloop-installed: everything).
$(BIN)/.kernelloop-run-installed: pyproject.toml
	@command -v bwrap >/dev/null || { test "$$(id -u)" = 0 && apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; } \
	  || { echo "make: kernelloop runs submitted code only inside bubblewrap: install it (apt-get install bubblewrap)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.14.1
	$(BIN)/pip install -q -e .
	touch $@

$(BIN)/.kernelloop-installed: $(BIN)/.kernelloop-run-installed
	$(BIN)/pip install -q -e '.[test]'
	touch $@

run: $(BIN)/.kernelloop-run-installed
	$(BIN)/kernelloop agent run --problem causal_conv1d

# Two test files at a time (pytest-xdist, a file's tests in one process): the suite spends about half its time
# waiting on services, sandboxes and deadlines, so on a 2-core machine two processes finish in about 12 minutes
# what one does in 19. TEST_PROCESSES=0 runs it in this process alone.
TEST_PROCESSES ?= 2
test: $(BIN)/.kernelloop-installed
	$(BIN)/python -m pytest --numprocesses=$(TEST_PROCESSES) --dist=loadfile

# The quality gate CI runs beside the tests: lint, formatting and types.
check: $(BIN)/.kernelloop-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python scripts/typecheck.py

# Every GPU path on this machine's GPU (the GPU tests, then compile, test, bench and profile of a CUDA template, a
# Triton kernel, a KernelBench file and the Mamba template, then a null-suite sample), ending with one table.
# KERNELBENCH=DIR (KernelBench's folder of level folders) adds the real level-1 file and the null-suite sample.
gpu-check: $(BIN)/.kernelloop-installed
	$(BIN)/python scripts/gpu_check.py $(if $(KERNELBENCH),--kernelbench $(KERNELBENCH))

# Ten one-line sabotages of the judge, the sandbox and the queue (tests/mutations.toml): each must turn its tests red.
.PHONY: test-mutations
test-mutations: $(BIN)/.kernelloop-installed
	$(BIN)/python scripts/mutation_check.py
