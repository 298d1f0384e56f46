"""Import end to end (issue 41): a tiny model made here with transformers (random weights, the
sample's SentencePiece tokenizer beside it, as TinyLlama ships one) -> `lenext convert --from-hf`
-> `lenext train` on 2 ranks under ZeRO-2 from it (checkpoint.init_from) -> `lenext convert
--format stock --verify`; and the paper's workflow on a stand-in for SmolLM3-3B / TinyLlama-NoPE:
an all-NoPE SmolLM3 imported, then `lenext extend` (sweep, HeadScale search, export, eval)."""
import json
import shutil
import subprocess
import sys

import pytest
import torch

from helpers import LAUNCHER, REPO, env, free_port, pretrain_cmd, run

pytestmark = pytest.mark.e2e
L = 32
QUIET = ["logging.tensorboard=false", "logging.progress_bar=false", "logging.peak_tflops=1.0"]


def standin(folder, no_rope_layers):
    """A SmolLM3ForCausalLM of 2 layers with random weights, saved with the sample tokenizer."""
    from transformers import AutoModelForCausalLM, SmolLM3Config

    torch.manual_seed(0)
    cfg = SmolLM3Config(vocab_size=4096, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=L,
                        no_rope_layers=no_rope_layers, bos_token_id=1, eos_token_id=2,
                        pad_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.save_pretrained(folder)
    shutil.copyfile(REPO / "data/sample/tokenizer.model", folder / "tokenizer.model")
    return model


def lenext(*args, timeout=600):
    p = subprocess.run([sys.executable, "-m", "lenext_dist", *map(str, args)], cwd=REPO, env=env(),
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return p.stdout


def data(shards) -> list[str]:
    return [f"data.blend={json.dumps(shards['blend'])}", "data.valid_blend=[]"]


def test_import_train_2_ranks_zero2_export(sample_shards, tmp_path):
    hf_dir, imp, trained = tmp_path / "hf", tmp_path / "imported", tmp_path / "trained"
    source = standin(hf_dir, [1, 0])  # RoPE then NoPE (SmolLM3's interleave)
    out = lenext("convert", "--from-hf", hf_dir, "--out", imp, *data(sample_shards), *QUIET)
    assert "SmolLM3ForCausalLM" in out and (imp / "tokenizer.model").is_file()
    run(pretrain_cmd(imp / "config.yaml", LAUNCHER, 2, free_port(), f"run_dir={trained}",
                     "parallel.zero_stage=2", "train.steps=3", "train.micro_batch_size=2",
                     "train.global_batch_size=4", "train.eval_interval=0", "optim.lr=1e-5",
                     "optim.warmup_steps=1", "checkpoint.interval=0"), timeout=600)
    log = (trained / "checkpoints" / "step_0000003" / "config.yaml").read_text()
    assert f"init_from: {imp / 'checkpoints'}" in log
    out = lenext("convert", "--checkpoint", trained / "checkpoints", "--out", tmp_path / "back",
                 "--format", "stock", "--verify")
    assert "verify: max |logits_hf - logits_megatron|" in out and "(ok," in out

    # it trained from the imported weights: a few steps at lr 1e-5 stay next to the source model
    from transformers import AutoModelForCausalLM

    back = AutoModelForCausalLM.from_pretrained(tmp_path / "back", dtype=torch.float32).eval()
    tokens = torch.randint(0, 4096, (2, L), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = source(input_ids=tokens).logits, back(input_ids=tokens).logits
    assert 0 < (a - b).abs().max().item() < 1e-2


def test_paper_workflow_extend_on_an_imported_nope_model(sample_shards, tmp_path):
    hf_dir, imp, ext = tmp_path / "smollm3-nope", tmp_path / "imported", tmp_path / "ext"
    standin(hf_dir, [0, 0])  # every layer NoPE
    lenext("convert", "--from-hf", hf_dir, "--out", imp, *data(sample_shards), *QUIET)
    assert "kind: uniform" in (imp / "config.yaml").read_text()
    lenext("extend", "--base", imp, "--targets", "64", "--out", ext, "--steps", "2",
           "--global-batch", "4", "--warmup", "1", "--nproc", "2", "--port", free_port(),
           "--eval-factors", "1,2", "--stride", "16", "--budget-tokens", "128", "--c-step", "0.4",
           "--passkey-keys", "0", "--entropy-samples", "0", "--threads", "1",
           "--data", REPO / "data/sample/heldout/books.jsonl.zst", timeout=900)
    scales = json.loads((ext / "hs-64" / "head_scales.json").read_text())["head_scales"]
    assert len(scales) == 2 and all(len(r) == 4 for r in scales)
    assert json.loads((ext / "hf" / "hs-64" / "config.json").read_text())["position"] == "nope"
    assert "HeadScale PPL" in (ext / "report.md").read_text()
