# lenext_dist: every command a user meets. `make demo` and `make test` set up .venv themselves.
PY        ?= python3
VENV      ?= .venv
BIN       := $(VENV)/bin
# The tested torch line (pyproject.toml pins it): the CPU build lies on disk here; on a Linux GPU
# host PyPI's torch==2.13.0 is the CUDA build (check: make gpu-check), as in docker/Dockerfile.gpu.
TORCH_SPEC ?= torch==2.13.0
NPROC     ?= 2
PORT      ?= 29500
PYTEST_ARGS ?=
# Where DeepSpeed JIT-builds its ops (cpu_adam for ZeRO-Offload): per checkout, never shared.
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions

.PHONY: setup system-deps demo shards task-shards lint test test-fast mutation dry-run bench study study-quick study-regime gpu-check clean

setup: $(VENV)/.installed

# -qq: pip's errors only (no index/location warnings, no progress); a failed install still stops make.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -qq --disable-pip-version-check --upgrade pip
	$(BIN)/pip install -qq --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/pip install -qq --disable-pip-version-check -e ".[dev]"
	touch $@

# The embedded default, the whole pipeline: real-text sample + generated task documents (30% of the
# tokens: passkey, recall, copy) -> shards/sample -> a tiny NoPE model on 2 CPU ranks (ZeRO-2) ->
# HF export (verified by logits) -> sliding-window PPL, passkey accuracy and task-format retrieval
# (the training generators' documents) at 1x/2x/4x the training length with c = 1.0 and c = 1.5
# -> report. A few minutes.
DEMO      := tiny-cpu-nope-tasks
EVAL_DATA := data/sample/heldout/books.jsonl.zst
demo: setup shards task-shards
	$(BIN)/deepspeed --num_gpus $(NPROC) --master_port $(PORT) launch/pretrain.py --config configs/exp/$(DEMO).yaml
	$(BIN)/python -m lenext_dist.convert --checkpoint runs/$(DEMO)/checkpoints --out runs/$(DEMO)/hf --overwrite --verify
	for c in 1.0 1.5; do \
	  $(BIN)/lenext eval ppl --model runs/$(DEMO)/hf --data $(EVAL_DATA) --lengths 128,256,512 --stride 64 \
	      --budget-tokens 20000 --scale-c $$c --out runs/$(DEMO)/eval || exit 1; \
	  $(BIN)/lenext eval passkey --model runs/$(DEMO)/hf --lengths 128,256,512 --depths 3 --keys 5 \
	      --scale-c $$c --out runs/$(DEMO)/eval || exit 1; \
	  $(BIN)/lenext eval tasks --model runs/$(DEMO)/hf --data $(EVAL_DATA) --lengths 128,256,512 \
	      --tasks passkey,recall,copy --docs 16 --scale-c $$c --out runs/$(DEMO)/eval || exit 1; \
	done
	$(BIN)/lenext report --runs runs/$(DEMO)/eval --out runs/$(DEMO)/report.md
	@echo "report: runs/$(DEMO)/report.md"

shards: setup shards/sample/.done

shards/sample/.done: data/sample/tokenizer.model
	$(BIN)/python data_prep/shard.py --input 'data/sample/slimpajama/chunk*/*.jsonl.zst' --format slimpajama \
	    --tokenizer data/sample/tokenizer.model --out shards/sample --name slimpajama \
	    --valid-fraction 0.02 --workers $(NPROC)
	$(BIN)/python data_prep/shard.py --input 'data/sample/starcoderdata/*/*.parquet' --format starcoder \
	    --tokenizer data/sample/tokenizer.model --out shards/sample --name starcoder --workers $(NPROC)
	touch $@

# Generated task documents (passkey twice as often as recall and copy) over the sample's prose, for
# configs/data/sample-tasks.yaml and the study (docs/data-preparation.md, Task documents). The
# generator list is lenext_dist/study/pipeline.py's SAMPLE_TASKS (the study makes these shards too).
# The stamp names the answer masks and the generator list: shards made before them are remade, and
# that older run's outputs go first (shard.py refuses to resume a run whose settings changed).
task-shards: setup shards/sample/.tasks-copy-done

shards/sample/.tasks-copy-done: data/sample/tokenizer.model
	rm -rf shards/sample/.tasks-done shards/sample/.tasks-answers-done shards/sample/tasks.parts \
	    shards/sample/tasks.manifest.json shards/sample/tasks_train*
	$(BIN)/python data_prep/shard.py --format tasks --tasks passkey:2,recall,copy \
	    --input 'data/sample/slimpajama/chunk*/*.jsonl.zst' --tokenizer data/sample/tokenizer.model \
	    --out shards/sample --name tasks --task-passes 2 --workers $(NPROC)
	touch $@

dry-run: setup
	$(BIN)/python launch/pretrain.py --config configs/exp/tinyllama-1.1b-nope.yaml --dry-run \
	    --attention.head_scale.enabled=true

# Debian packages of the MPI/Slurm tests (openmpi, slurm-wlm, munge, pmix, shellcheck); a no-op
# when present, a printed apt command when not root.
system-deps:
	bash scripts/install_system_deps.sh

# ruff (pinned in the dev extra; rules in pyproject.toml [tool.ruff]); .ci/run runs it before the tests.
lint: setup
	$(BIN)/ruff check .

test: setup system-deps
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not distributed and not e2e" $(PYTEST_ARGS)

# Plant each bug of tests/mutation/mutations.py in turn and check the unit tests catch it (not part
# of `make test`; MUTATION_ARGS="--only NAME" for some, "--full" for the whole unit tier each time).
MUTATION_ARGS ?=
mutation: setup
	$(BIN)/python tests/mutation/run.py $(MUTATION_ARGS)

# The small-scale reproduction of the paper's findings (results/study/, published to docs/study/), and
# its quick version (results/study-quick/, what CI runs through tests/e2e/test_study_quick.py).
study: setup
	$(BIN)/python -m lenext_dist.study

study-quick: setup
	$(BIN)/python -m lenext_dist.study --quick

# The regime search (lenext_dist/study/regime.py): NoPE and RoPE per lever combination (task share,
# BOS, document mask, L, steps) -> results/regime/REGIME.md. ~15 min per pair of runs on 2 cores.
study-regime: setup task-shards
	$(BIN)/python -m lenext_dist.study --regime

bench: setup
	$(BIN)/pip install -q --no-deps mistral-common  # the 32K Mistral v1 model of bench_data_prep
	$(BIN)/python benchmarks/run_all.py

# What CPU tests cannot see, on this machine's GPUs (variants x HeadScale in bf16, ZeRO-2 on all
# GPUs, fp32/bf16 evaluation at 8x L, TinyLlama-shape MFU) -> runs/gpu-check/gpu_check.json.
# Without a CUDA device it prints a skip and exits 0.
gpu-check: setup
	$(BIN)/python -m lenext_dist.gpu_check --out runs/gpu-check/gpu_check.json

clean:
	rm -rf runs shards .pytest_cache
