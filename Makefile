# bert_suite: every job is a target. `make test` builds .venv from nothing and runs the tests.
PYTHON     ?= python3
VENV       ?= .venv
# torch is installed first and pinned, so that no dependency pulls a different (CUDA) build.
# GPU users: make install TORCH_SPEC="torch==2.13.0" TORCH_INDEX="--index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
BIN        := $(VENV)/bin
STAMP      := $(VENV)/.bert_suite_installed
OFFLINE    := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_EVALUATE_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PYTEST_ARGS ?=

.PHONY: help install test test-all test-gpu lint clean

help:  ## this list
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9-]+):.*## (.*)/  make \1\t\2/' | expand -t 22

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	@# --no-compile: pip byte-compiles every module one by one, about half the install (40 of torch's 55 s,
	@# about 85 of the rest's 190 on 2 cores)...
	$(BIN)/python -m pip install --quiet --no-compile $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet --no-compile -c constraints.txt -e ".[dev,postgres,onnx,dashboard,cluster]"
	@# ...and compile everything here on every core: a fresh .venv's first `make test` otherwise compiled in its
	@# workers and their children at once (468 s against 386 s); pip's serial compile took 125 s, this about 30
	@# (a file another Python's syntax, such as torch's py312_intrinsics.py test module, is left as it is). The
	@# packages' own test folders (60 MB of pyarrow, pandas, scipy... tests nothing here imports) and pip's and
	@# setuptools' files are left to compile if ever imported: 27-29 s against 53-71 s, on 2 cores beside other work
	$(BIN)/python -m compileall -q -j 0 -x 'py312_intrinsics|site-packages/.+/tests?/|site-packages/(pip|setuptools|pkg_resources|_distutils_hack)/' \
		$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") >/dev/null || \
		echo "note: some installed files did not byte-compile (they compile, or fail, when imported)"
	@# the dashboard's browser test drives Debian's chromium (playwright cannot download its own browser here)
	@command -v chromium >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the browser test"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && \
		apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; } || \
		echo "note: chromium could not be installed; the dashboard's browser test will be skipped"; \
	else echo "note: no chromium; as root: apt-get install chromium (the dashboard's browser test is skipped without it)"; fi; }
	touch $(STAMP)

install: $(STAMP)  ## the .venv (torch pinned, CPU build), once

# `make test` runs TEST_WORKERS pytest workers (pytest-xdist) of one thread each: faster on 2 cores than one process of
# two threads (a test's time is mostly the processes it starts; timings in docs/testing.md); TEST_WORKERS=0: one
TEST_WORKERS ?= 2
test: install  ## the fast offline tests (README)
	$(OFFLINE) $(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS) $(PYTEST_ARGS)

test-all: install  ## the tests, slow ones included
	$(OFFLINE) $(BIN)/python -m pytest $(PYTEST_ARGS)

test-gpu: install  ## the GPU checks (tests/test_gpu.py, tests/test_gpu_steps.py; skipped without CUDA)
	$(OFFLINE) $(BIN)/python -m pytest tests/test_gpu.py tests/test_gpu_steps.py $(PYTEST_ARGS)

lint: install  ## ruff on all Python in the repository
	$(BIN)/ruff check .

clean:  ## remove .venv and build outputs
	rm -rf $(VENV) .pytest_cache build dist src/*.egg-info

# ---- GLUE: the paper's exhaustive grid on one task (see docs/glue.md) --------------------------
TASK      ?= rte
MODEL     ?= google-bert/bert-base-uncased
DATA_DIR  ?=
TOKENIZER ?=
OUT       ?= runs/$(TASK)-grid
GRID_ARGS ?=
WORKERS_PER_GPU ?=
GPUS ?=
# --data_dir / --tokenizer when DATA_DIR / TOKENIZER are set (every task target passes them)
DATA_FLAGS = $(if $(DATA_DIR),--data_dir $(DATA_DIR)) $(if $(TOKENIZER),--tokenizer $(TOKENIZER))
# --workers_per_gpu / --gpus when WORKERS_PER_GPU / GPUS are set (several workers on one or several GPUs)
WORKER_FLAGS = $(if $(WORKERS_PER_GPU),--workers_per_gpu $(WORKERS_PER_GPU)) $(if $(GPUS),--gpus $(GPUS))

.PHONY: glue
glue: install  ## the paper's grid on a GLUE task (TASK=rte MODEL=... DATA_DIR=... WORKERS_PER_GPU=2 GPUS=0,1)
	$(BIN)/bert-suite grid $(TASK) --model $(MODEL) --output_dir $(OUT) \
		$(DATA_FLAGS) $(WORKER_FLAGS) $(GRID_ARGS)

# ---- SQuAD: the card's grid (paper: v1.1 3 epochs, v2.0 2 epochs, lr 5e-5); see docs/squad.md ----
# DATA_DIR holds the official train-v1.1.json/dev-v1.1.json (or the v2.0 files); empty = the Hub.
VERSION   ?= 1
SQUAD_CARD = $(if $(filter 2 2.0,$(VERSION)),squad/v2,squad/v1)

.PHONY: squad
squad: install  ## the SQuAD grid (VERSION=1|2)
	$(BIN)/bert-suite grid $(SQUAD_CARD) --model $(MODEL) --output_dir $(or $(SQUAD_OUT),runs/squad-v$(VERSION)-grid) \
		$(DATA_FLAGS) $(WORKER_FLAGS) $(GRID_ARGS)

# ---- SWAG and CoNLL-2003 NER: the cards' grids (see docs/swag-ner.md) -------------------
# NER_CONTEXT=document|sentence (the paper: document context)
NER_CONTEXT ?= document

.PHONY: swag ner
swag: install  ## the SWAG grid
	$(BIN)/bert-suite grid swag --model $(MODEL) --output_dir $(or $(SWAG_OUT),runs/swag-grid) \
		$(DATA_FLAGS) $(WORKER_FLAGS) $(GRID_ARGS)

ner: install  ## the CoNLL-2003 grid (NER_CONTEXT=document|sentence)
	$(BIN)/bert-suite grid conll2003 --model $(or $(NER_MODEL),google-bert/bert-base-cased) --context $(NER_CONTEXT) \
		--output_dir $(or $(NER_OUT),runs/conll2003-$(NER_CONTEXT)-grid) \
		$(DATA_FLAGS) $(WORKER_FLAGS) $(GRID_ARGS)

# ---- Pre-training (see docs/pretraining.md) ---------------------------------------------------
# `make pretrain` runs the tiny config end to end on the embedded corpus (stdlib documentation);
# PRETRAIN_CONFIG / PRETRAIN_ARGS (key=value overrides) / ACCELERATE_CONFIG choose otherwise.
PRETRAIN_CONFIG   ?= recipes/configs/pretrain/tiny.yaml
PRETRAIN_ARGS     ?=
ACCELERATE_CONFIG ?= recipes/configs/accelerate/cpu.yaml
CORPUS            ?= runs/corpus/pretrain.txt

.PHONY: pretrain pretrain-data demo
runs/corpus/pretrain.txt: | install
	$(BIN)/bert-suite corpus --output_dir runs/corpus

runs/pretrain-tokenizer/vocab.txt: $(CORPUS)
	$(OFFLINE) $(BIN)/bert-suite tokenizer --input $(CORPUS) --vocab_size 8000 --lowercase --output_dir runs/pretrain-tokenizer

runs/pretrain-data/%/pretrain_data_stats.json: runs/pretrain-tokenizer/vocab.txt
	$(OFFLINE) $(BIN)/bert-suite pretrain-data --input $(CORPUS) --tokenizer runs/pretrain-tokenizer \
		--max_seq_length $* --dupe_factor $(if $(filter 128,$*),5,1) --output_dir runs/pretrain-data/$*

pretrain-data: runs/pretrain-data/128/pretrain_data_stats.json runs/pretrain-data/512/pretrain_data_stats.json  ## NSP instances at 128 and 512 from the embedded corpus

pretrain: pretrain-data  ## pre-training with the recipe (PRETRAIN_CONFIG, PRETRAIN_ARGS)
	$(OFFLINE) $(BIN)/accelerate launch --config_file $(ACCELERATE_CONFIG) recipes/pretrain.py \
		--config $(PRETRAIN_CONFIG) $(PRETRAIN_ARGS)

# The README's first command: corpus -> vocabulary -> pre-training -> fine-tuning grid, offline.
demo: install  ## the embedded demo: corpus -> vocabulary -> pre-training -> grid
	$(OFFLINE) $(BIN)/bert-suite demo --output_dir runs/demo

# ---- The paper's ablations (docs/ablation.md): `bert-suite ablation recipes/ablations/NAME.yaml`. `make table5`
# runs Table 5 in miniature (MLM + NSP, MLM only, left-to-right; + BiLSTM and the random twin; a curve over
# pre-training steps) and copies its record to benchmarks/results/table5_small.{json,md,png}. Hours on 2 CPU
# cores; rerun after a kill and it resumes. Needs the data in BERT_SUITE_DATA (default: ../shared/data).
TABLE5_OUT ?= runs/table5
.PHONY: table5
table5: install  ## Table 5 in miniature: benchmarks/results/table5_small.{json,md,png}
	$(OFFLINE) $(BIN)/bert-suite ablation recipes/ablations/table5.yaml --output_dir $(TABLE5_OUT) --workers 2
	for f in json md png; do cp $(TABLE5_OUT)/ablation.$$f benchmarks/results/table5_small.$$f; done

# ---- Benchmarks (benchmarks/README.md; results: benchmarks/RESULTS.md). Each skips cleanly without ../shared/data.
# On the CPU; the same pre-training and fine-tuning benchmarks take --device cuda (make gpu-check runs them there).
# The studies of models (which objective, size or masking wins) are ablation files: recipes/ablations/*.yaml.
# `make bench`: the quick mode (9 minutes on a 2-core AVX-512 Xeon, more on slower CPUs); `make bench-full`: more steps,
# repetitions, the whole RTE/MRPC train sets and the SQuAD processing benchmark. Results: runs/bench/*.json and the printed tables.
.PHONY: bench bench-full
bench: install  ## the quick benchmarks against stock transformers
	$(OFFLINE) $(BIN)/python benchmarks/pretrain_step.py --quick --profile
	$(OFFLINE) $(BIN)/python benchmarks/finetune_speed.py --quick --profile
	$(OFFLINE) $(BIN)/python benchmarks/pretrain_data_speed.py --repeat 1
	$(OFFLINE) $(BIN)/python benchmarks/cli_startup.py

# ---- A GPU check (benchmarks/gpu_check.sh; results: benchmarks/RESULTS.md). A GPU machine may be bare
# and offline: `make gpu-bundle` here writes .gpu-bundle/ (tools/gpu_bundle.sh: wheels it lacks, pytest among them, the
# project, a few data files, the step of revision BEFORE, the commit measured); copy the tree with it there and run
# `make gpu-check` (9 minutes: the speed benchmarks with --device cuda, tests/test_gpu.py's correctness and recipe
# checks; results in runs/gpu-check/, its gpu_record.json to file in benchmarks/results/gpu/). tools/README.md: the
# other tools for such a machine.
.PHONY: gpu-bundle gpu-check
gpu-bundle: install  ## .gpu-bundle/: what a bare GPU machine needs for make gpu-check (BEFORE=4889d2e)
	BEFORE=$(or $(BEFORE),4889d2e) PYTHON=$(BIN)/python bash tools/gpu_bundle.sh
	git rev-parse HEAD > $(or $(GPU_BUNDLE),.gpu-bundle)/commit  # gpu_record.json's commit where the tree has no .git

gpu-check:  ## on a GPU machine: correctness and speed in 9 minutes (runs/gpu-check/)
	OUT=$(or $(GPU_CHECK_OUT),runs/gpu-check) PYTHON=$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) \
		bash benchmarks/gpu_check.sh

bench-full: install  ## the full benchmarks
	$(OFFLINE) $(BIN)/python benchmarks/pretrain_step.py --profile
	$(OFFLINE) $(BIN)/python benchmarks/finetune_speed.py --profile
	$(OFFLINE) $(BIN)/python benchmarks/pretrain_data_speed.py --repeat 3
	$(OFFLINE) $(BIN)/python benchmarks/squad_processing_speed.py
