# Two entry points on a fresh machine: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo littlebird-recipe test lint bench docs install clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, at the pinned version: on Linux PyPI's wheel is a CUDA build (several GB); for a CPU-only
	# environment install it beforehand from https://download.pytorch.org/whl/cpu and this line keeps it
	$(BIN)/python -m pip install --quiet -c constraints.txt torch
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m posformers.finetune.demo

# BERT teacher -> posformers-convert littlebird -> distillation -> RSS -> long-document QA, held-out numbers in
# demo_output/littlebird-recipe/summary.md (finetune/littlebird_recipe.py; about 7 minutes on a quiet 2-core machine)
littlebird-recipe: $(STAMP)
	$(BIN)/posformers-littlebird-recipe --output_dir demo_output/littlebird-recipe

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run --model roformer

# The manual (docs/*.md, mkdocs.yml) as a static site in site/; --strict turns every warning (a broken link or
# anchor) into an error.
DOCS_STAMP := $(VENV)/.installed-docs

$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build dist site *.egg-info
