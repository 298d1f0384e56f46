# lenext_dist: every command a user meets. `make demo` and `make test` set up .venv themselves.
PY        ?= python3
VENV      ?= .venv
BIN       := $(VENV)/bin
# The tested torch line (pyproject.toml pins it): the CPU build lies on disk here; on a Linux GPU
# host PyPI's torch==2.13.0 is the CUDA build (check: make gpu-check), as in docker/Dockerfile.gpu.
TORCH_SPEC ?= torch==2.13.0
# The index torch (and only torch, with its own dependencies) comes from, e.g. PyTorch's CPU index;
# empty: PyPI. Never an extra index for the rest: a name on both would go to the higher version.
TORCH_INDEX ?=
NPROC     ?= 2
PORT      ?=
# (empty: each run picks a free port; 29500 is every torchrun's default, busy beside another job)
PYTEST_ARGS ?=
# Where DeepSpeed JIT-builds its ops (cpu_adam for ZeRO-Offload): per checkout, never shared.
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions

.PHONY: setup system-deps demo demo-text kv-shards shards task-shards lint test test-fast mutation dry-run bench study study-quick study-layouts study-sizes study-stage2 wheelhouse gpu-site gpu-check clean

setup: $(VENV)/.installed

# -qq: pip's errors only (no index/location warnings, no progress); a failed install still stops make.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -qq --disable-pip-version-check "pip==26.3"  # pinned (was --upgrade: whatever was newest that day)
	$(BIN)/pip install -qq --disable-pip-version-check $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(BIN)/pip install -qq --disable-pip-version-check -e ".[dev]"
	touch $@

# The demo: length generalization shown through the whole pipeline, in the synthetic key-value
# regime (docs/demo.md): kv documents of exactly L = 64 tokens -> shards/kv -> a NoPE and a RoPE
# model on 2 CPU ranks (ZeRO-2, the loss on the answers) -> HF export (verified by logits) ->
# retrieval of fresh documents at 1x-8x L with c = 1.0 and c = 1.5, beside a rule that never
# retrieves -> runs/demo/report.md and the table of docs/demo.md. About 6 minutes on 2 cores.
DEMO_POSITIONS ?= nope rope
DEMO_LENGTHS   := 64,128,256,512
KV_DATA        := data/kv/heldout/filler.jsonl
demo: setup kv-shards
	rm -rf runs/demo  # every run makes its results afresh (an older eval protocol's are refused, not mixed)
	for pos in $(DEMO_POSITIONS); do \
	  $(BIN)/lenext train --nproc $(NPROC) $(if $(PORT),--port $(PORT)) --config configs/exp/kv-$$pos.yaml || exit 1; \
	  $(BIN)/lenext convert --checkpoint runs/kv-$$pos/checkpoints \
	      --out runs/kv-$$pos/hf --overwrite --verify || exit 1; \
	  for c in 1.0 1.5; do \
	    $(BIN)/lenext eval tasks --model runs/kv-$$pos/hf --data $(KV_DATA) --tasks kv \
	        --lengths $(DEMO_LENGTHS) --docs 64 --scale-c $$c --out runs/demo/$$pos || exit 1; \
	  done; \
	done
	$(BIN)/lenext report --runs $(addprefix runs/demo/,$(DEMO_POSITIONS)) --out runs/demo/report.md
	$(BIN)/python -m lenext_dist.eval.demo_table --runs $(addprefix runs/demo/,$(DEMO_POSITIONS)) \
	    --out runs/demo/demo_table.md
	@echo "report: runs/demo/report.md"

# The kv regime's data (lenext prep kv, then the kv task generator over its filler): 4
# passes over 2M filler words, 170K documents of exactly 64 tokens (~30 s).
kv-shards: setup shards/kv/.done

shards/kv/.done: lenext_dist/prep/kv_corpus.py
	rm -rf shards/kv
	$(BIN)/lenext prep kv --out data/kv
	$(BIN)/lenext prep --format tasks --tasks kv --input 'data/kv/train/*.jsonl' \
	    --tokenizer data/kv/tokenizer.model --out shards/kv --name kv --task-passes 4 \
	    --valid-fraction 0.01 --workers $(NPROC)
	touch $@

# The text demo (real-text sample + task documents over its prose; a tiny NoPE at L = 128). It
# shows what the synthetic regime fixes: no model at this scale retrieves from real-text filler.
TEXT_DEMO := tiny-cpu-nope-tasks
EVAL_DATA := data/sample/heldout/books.jsonl.zst
demo-text: setup shards task-shards
	$(BIN)/lenext train --nproc $(NPROC) $(if $(PORT),--port $(PORT)) --config configs/exp/$(TEXT_DEMO).yaml
	$(BIN)/lenext convert --checkpoint runs/$(TEXT_DEMO)/checkpoints --out runs/$(TEXT_DEMO)/hf --overwrite --verify
	for c in 1.0 1.5; do \
	  $(BIN)/lenext eval ppl --model runs/$(TEXT_DEMO)/hf --data $(EVAL_DATA) --lengths 128,256,512 --stride 64 \
	      --budget-tokens 20000 --scale-c $$c --out runs/$(TEXT_DEMO)/eval || exit 1; \
	  $(BIN)/lenext eval tasks --model runs/$(TEXT_DEMO)/hf --data $(EVAL_DATA) --lengths 128,256,512 \
	      --tasks passkey,recall,copy --docs 16 --scale-c $$c --out runs/$(TEXT_DEMO)/eval || exit 1; \
	done
	$(BIN)/lenext report --runs runs/$(TEXT_DEMO)/eval --out runs/$(TEXT_DEMO)/report.md
	@echo "report: runs/$(TEXT_DEMO)/report.md"

shards: setup shards/sample/.done

shards/sample/.done: data/sample/tokenizer.model
	$(BIN)/lenext prep --input 'data/sample/slimpajama/chunk*/*.jsonl.zst' --format slimpajama \
	    --tokenizer data/sample/tokenizer.model --out shards/sample --name slimpajama \
	    --valid-fraction 0.02 --workers $(NPROC)
	$(BIN)/lenext prep --input 'data/sample/starcoderdata/*/*.parquet' --format starcoder \
	    --tokenizer data/sample/tokenizer.model --out shards/sample --name starcoder --workers $(NPROC)
	touch $@

# Generated task documents (passkey twice as often as recall and copy) over the sample's prose, for
# configs/data/sample-tasks.yaml and `make demo-text` (docs/data-preparation.md, Task documents). The
# generator list is written here literally (it was the retired text-regime study's SAMPLE_TASKS);
# change it together with the stamp name below.
# The stamp names the answer masks and the generator list: shards made before them are remade, and
# that older run's outputs go first (lenext prep refuses to resume a run whose settings changed).
task-shards: setup shards/sample/.tasks-copy-done

shards/sample/.tasks-copy-done: data/sample/tokenizer.model
	rm -rf shards/sample/.tasks-done shards/sample/.tasks-answers-done shards/sample/tasks.parts \
	    shards/sample/tasks.manifest.json shards/sample/tasks_train*
	$(BIN)/lenext prep --format tasks --tasks passkey:2,recall,copy \
	    --input 'data/sample/slimpajama/chunk*/*.jsonl.zst' --tokenizer data/sample/tokenizer.model \
	    --out shards/sample --name tasks --task-passes 2 --workers $(NPROC)
	touch $@

dry-run: setup
	$(BIN)/lenext train --config configs/exp/tinyllama-1.1b-nope.yaml --dry-run \
	    --attention.head_scale.enabled=true

# Debian packages of the MPI/Slurm tests (openmpi, slurm-wlm, munge, pmix, shellcheck); a no-op
# when present, a printed apt command when not root (SYSTEM_DEPS_SUDO=1: install with sudo).
system-deps:
	bash scripts/install_system_deps.sh

# ruff (pinned in the dev extra; rules in pyproject.toml [tool.ruff]); .ci/run runs it before the tests.
lint: setup
	$(BIN)/ruff check .

# --durations: the slowest tests at the end of every run (the suite's budget is ~35 minutes)
test: setup system-deps
	$(BIN)/python -m pytest -q --durations=30 $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not distributed and not e2e" $(PYTEST_ARGS)

# Plant each bug of tests/mutation/mutations.py in turn and check the unit tests catch it (not part
# of `make test`; MUTATION_ARGS="--only NAME" for some, "--full" for the whole unit tier each time).
MUTATION_ARGS ?=
mutation: setup
	$(BIN)/python tests/mutation/run.py $(MUTATION_ARGS)

# The NoPE length-generalization study in the synthetic key-value regime (experiments/nope_length,
# an experiment on top of the library): results/nope_length/; `python -m experiments.nope_length
# --publish` copies its records to experiments/nope_length/results/. The quick version is a smoke
# run (what experiments/nope_length/tests/test_nope_length_quick.py runs).
study: setup
	$(BIN)/python -m experiments.nope_length

study-quick: setup
	$(BIN)/python -m experiments.nope_length --quick

# NoPE inside hybrid layouts (experiments/nope_layouts): NoPE, RoPE, 3:1 interleave, local RoPE +
# global NoPE, iRoPE, three seeds each trained until the gate (a budget of 7500 steps), scored with
# each temperature schedule on the NoPE layers (~3 h, resumable).
study-layouts: setup
	$(BIN)/python -m experiments.nope_layouts

# The best-c slope a at three NoPE sizes (2L d64, 4L d64, 4L d128; three seeds each, to the gate) and
# HeadScale with its two ablations at the largest (experiments/sizes; ~2 h, resumable).
study-sizes: setup
	$(BIN)/python -m experiments.sizes

# What stage 2 buys (experiments/stage2): NoPE, RoPE, 3:1 interleave, iRoPE, two seeds, each chosen
# checkpoint continued 300 steps at 4L, judged against the zero-shot methods at 4-16 L (~100 min).
study-stage2: setup
	$(BIN)/python -m experiments.stage2

bench: setup
	$(BIN)/pip install -q --no-deps "mistral-common==1.13.1"  # the 32K Mistral v1 model of bench_data_prep
	$(BIN)/python benchmarks/run_all.py

# The first GPU hour (docs/cluster.md#gpu-check-make-gpu-check). Here, with network: `make wheelhouse`
# builds wheelhouse/py$(PYVER)/, the wheels a node with its own torch lacks (DeepSpeed, megatron-core,
# transformers, this package, ...), <= 64 MiB. On the node: `make gpu-check` installs them with
# --no-index --no-deps into $(GPU_SITE) beside the node's torch (never replacing it) and runs the
# check (<= 8 minutes on one H100) -> benchmarks/results/gpu/*.json + .md. GPU_CHECK_ARGS=--dry
# writes the plan without a GPU; an NVIDIA device that torch cannot use is a one-line exit 1.
PYVER      ?= 3.12
WHEELHOUSE ?= wheelhouse/py$(PYVER)
GPU_PY     ?= python3
GPU_SITE   ?= .cache/gpu-site
GPU_CHECK_ARGS ?=
wheelhouse: setup
	$(BIN)/python -m lenext_dist.gpu.wheelhouse --python-version $(PYVER) --out $(WHEELHOUSE)

gpu-site:
	@test -f $(WHEELHOUSE)/requirements.txt || { echo "gpu-check: no $(WHEELHOUSE)/requirements.txt: \
	run 'make wheelhouse PYVER=$(PYVER)' where there is network, then copy wheelhouse/ here"; exit 1; }
	$(GPU_PY) -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --upgrade \
	    --find-links $(WHEELHOUSE) --target $(GPU_SITE) -r $(WHEELHOUSE)/requirements.txt

gpu-check: gpu-site
	PYTHONPATH=$(abspath $(GPU_SITE)) $(GPU_PY) -m lenext_dist.gpu $(GPU_CHECK_ARGS)

clean:
	rm -rf runs shards .pytest_cache
