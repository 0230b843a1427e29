# Every target bootstraps .venv on first use. Torch is installed only when the venv lacks it,
# so a GPU user's torch stays untouched; override the pin with `make test TORCH=torch==X`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.oled-installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export NO_MKDOCS_2_WARNING := 1

.PHONY: demo test wheel-check docs bench lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[serve,eval,dev,plot,fast,docs]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m oled_hf.cli.main demo

# pytest runs in TEST_WORKERS processes (pytest-xdist; a module's tests stay in one worker, in order) and the
# wheel check (.ci/wheel-check) beside them; its log follows. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mkdocs build --strict --quiet --site-dir site
	@mkdir -p build
	PYTHON=$(PYTHON) TORCH="$(TORCH)" .ci/wheel-check > build/wheel-check.log 2>&1 & check=$$!; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile; tests=$$?; \
	wait $$check; wheel=$$?; cat build/wheel-check.log; \
	[ $$tests -eq 0 ] && [ $$wheel -eq 0 ]

# the built wheel in a bare venv with only its declared dependencies (part of `make test`)
wheel-check: $(STAMP)
	PYTHON=$(PYTHON) TORCH="$(TORCH)" .ci/wheel-check

# the documentation (docs/) as a site in site/; --strict: a broken link or anchor fails
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) eval/bench_generate.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build site *.egg-info
