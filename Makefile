# Two entry points on a fresh machine: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# One stamp per installed set: `make demo` installs the train extra, `make test` the dev set, so a `make test` after
# `make demo` still installs what the tests need.
TRAIN_STAMP := $(VENV)/.installed-train
STAMP := $(VENV)/.installed-dev
# A second venv with the newest transformers (constraints-newest.txt's pins replace constraints.txt's).
NEWEST := .venv-newest
NEWEST_STAMP := $(NEWEST)/.installed
NEWEST_EXTRAS := train,test

.PHONY: demo littlebird-recipe test lint bench docs install clean

# $(call install,VENV,CONSTRAINTS,EXTRAS): torch first, at the pinned version: on Linux PyPI's wheel is a CUDA build
# (several GB); for a CPU-only environment install it beforehand from https://download.pytorch.org/whl/cpu and this
# line keeps it. Then posformers (editable) with the extras.
define install
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet -c constraints.txt torch
	$(1)/bin/python -m pip install --quiet -c $(2) -e ".[$(3)]"
endef

$(TRAIN_STAMP): pyproject.toml constraints.txt
	$(call install,$(VENV),constraints.txt,train)
	touch $@

# GLiNER (the drop-in tests run it) pins transformers<5.17, which excludes ours: installed without its dependencies,
# which the dev set already holds (constraints.txt pins its version).
$(STAMP): pyproject.toml constraints.txt
	$(call install,$(VENV),constraints.txt,dev)
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt gliner
	touch $@ $(TRAIN_STAMP)

$(NEWEST_STAMP): pyproject.toml constraints.txt constraints-newest.txt
	mkdir -p $(NEWEST)
	awk -F'==' 'NR == FNR { if (/^[^#]/) newest[$$1] = 1; print; next } !($$1 in newest)' \
		constraints-newest.txt constraints.txt > $(NEWEST)/constraints.txt
	$(call install,$(NEWEST),$(NEWEST)/constraints.txt,$(NEWEST_EXTRAS))
	touch $@

install: $(STAMP)

demo: $(TRAIN_STAMP)
	$(BIN)/python -m posformers.finetune.demo

# BERT teacher -> posformers-convert littlebird -> distillation -> RSS -> long-document QA, held-out numbers in
# demo_output/littlebird-recipe/summary.md (finetune/littlebird_recipe.py; about 7 minutes on a quiet 2-core machine)
littlebird-recipe: $(TRAIN_STAMP)
	$(BIN)/posformers-littlebird-recipe --output_dir demo_output/littlebird-recipe

# The subset run against the newest transformers: the model contracts, configs, the three models' tests (parity with
# transformers' own RoFormer and DeBERTa included), the Hub round trips and the remote-code closure (read with the
# newest transformers' own import scan); not the slow tests, the two slowest others, nor the one that needs rjieba (a
# dev-only tokenizer dependency). test_private_apis.py: what the drop-in reads of transformers beyond its public API.
NEWEST_TESTS := -m "not slow" tests/models/test_contracts.py tests/models/test_configs.py \
	tests/models/test_roformer.py tests/models/test_deberta.py tests/models/test_littlebird.py \
	tests/models/test_remote_code_closure.py tests/test_hub.py tests/integrations/test_private_apis.py \
	--deselect tests/models/test_roformer.py::test_output_attentions_with_flex_is_refused_clearly \
	--deselect tests/models/test_littlebird.py::test_gradients_of_the_kernel_match_finite_differences \
	--deselect tests/models/test_roformer.py::test_real_vocabularies_run_through_the_model

# One pytest process per core (at most 4), each taking whole test files, so that a file's module fixtures are built
# once, in the order tests/conftest.py gives them (the longest first); `pytest` alone runs the same tests in one
# process. The 25 slowest tests are listed at the end.
test: $(STAMP) $(NEWEST_STAMP)
	$(BIN)/python -m pytest -q --numprocesses auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder --durations 25
	$(NEWEST)/bin/python -m pytest -q $(NEWEST_TESTS)

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
	rm -rf $(VENV) $(NEWEST) build dist site *.egg-info
