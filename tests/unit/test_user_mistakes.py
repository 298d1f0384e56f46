"""A user's mistake is one `error:` line naming the file or flag, exit 2, never a traceback (issue
40, finding 8): each case below raised a library's exception through the command before (a
UnicodeDecodeError, sentencepiece's RuntimeError, safetensors' SafetensorError, transformers'
OSError, zstandard's ZstdError, torch's RuntimeError/AssertionError for a device, FileExistsError
from os.makedirs under a file). The commands run in-process through their real entry point."""
import json
import shutil

import pytest

from lenext_dist.checkpoint.layout import resolve
from lenext_dist.cli import main
from lenext_dist.errors import CheckpointError, UserError
from tiny_models import REPO, save_tiny_model

BOOKS = f"{REPO}/data/sample/heldout/books.jsonl.zst"
GARBAGE = bytes(range(256)) * 16  # no text, no protobuf, no JSON, no zstd frame


def _one_error_line(capsys, rc, *needles):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]  # (transformers' bars aside)
    assert rc == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """A tiny stock Llama folder (config.json, model.safetensors, tokenizer.model)."""
    return save_tiny_model(str(tmp_path_factory.mktemp("hf") / "model"), layers=1)


@pytest.fixture
def garbage(tmp_path):
    p = tmp_path / "garbage.bin"
    p.write_bytes(GARBAGE)
    return str(p)


def _copy(hf, tmp_path, name="copy"):
    return shutil.copytree(hf, tmp_path / name)


def _ppl(model, *extra):
    return main(["eval", "ppl", "--model", str(model), "--data", BOOKS, "--lengths", "32",
                 "--max-docs", "1", "--device", "cpu", "--no-progress", *extra])


# ------------------------------------------------------------------ a file where a folder is needed
def test_an_output_path_under_a_file_is_one_line(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "r.json").write_text(json.dumps({"kind": "some future kind"}))
    rc = main(["report", "--runs", str(runs), "--out", str(afile / "report.md")])
    _one_error_line(capsys, rc, str(afile), "a file where a folder is needed")
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"text": "a few words of text"}) + "\n")
    rc = main(["prep", "tokenizer", "--input", str(docs), "--format", "jsonl",
               "--model-prefix", str(afile / "spm")])
    _one_error_line(capsys, rc, str(afile), "a file where a folder is needed")


@pytest.mark.parametrize("vocab, says", [("0", "vocab_size()) > (0)"), ("5000", "Vocabulary size too high")])
def test_a_vocabulary_sentencepiece_cannot_train_is_one_line(vocab, says, tmp_path, capsys):
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"text": "a few words of text"}) + "\n")
    rc = main(["prep", "tokenizer", "--input", str(docs), "--format", "jsonl",
               "--model-prefix", str(tmp_path / "spm"), "--vocab-size", vocab])
    _one_error_line(capsys, rc, "--vocab-size", says)


# ------------------------------------------------------------------ a damaged `latest`
@pytest.mark.parametrize("content", [GARBAGE, b"\n", b"step_" + b"1" * 300, b"../x"])
def test_a_damaged_latest_is_a_checkpoint_error(content, tmp_path):
    (tmp_path / "latest").write_bytes(content)
    with pytest.raises(CheckpointError, match="latest: not a checkpoint tag") as e:
        resolve(tmp_path)
    assert "\n" not in str(e.value)


def test_convert_of_a_checkpoint_with_a_damaged_latest_is_one_line(tmp_path, capsys):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_bytes(GARBAGE)
    rc = main(["convert", "--checkpoint", str(tmp_path / "checkpoints"), "--out", str(tmp_path / "o")])
    _one_error_line(capsys, rc, "latest: not a checkpoint tag")


# ------------------------------------------------------------------ tokenizers that are not SentencePiece
def test_a_damaged_tokenizer_is_one_line(hf, garbage, tmp_path, capsys):
    from lenext_dist.data.gpt_data import ShardTokenizer

    with pytest.raises(UserError, match="data.tokenizer: .*garbage.bin: not a SentencePiece model"):
        ShardTokenizer.from_sentencepiece(garbage)
    _one_error_line(capsys, _ppl(hf, "--tokenizer", garbage, "--out", str(tmp_path / "r")),
                    "--tokenizer", garbage, "not a SentencePiece model")
    damaged = _copy(hf, tmp_path)
    (damaged / "tokenizer.model").write_bytes(GARBAGE)  # the model folder's own
    _one_error_line(capsys, _ppl(damaged, "--out", str(tmp_path / "r2")),
                    str(damaged / "tokenizer.model"), "not a SentencePiece model")


def test_convert_with_a_damaged_tokenizer_is_one_line(hf, garbage, tmp_path, capsys):
    assert main(["convert", "--from-hf", hf, "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    rc = main(["convert", "--checkpoint", str(tmp_path / "run" / "checkpoints"), "--out",
               str(tmp_path / "export"), "--tokenizer", garbage])
    _one_error_line(capsys, rc, garbage, "not a SentencePiece model")
    assert not (tmp_path / "export").exists()


# ------------------------------------------------------------------ model folders
@pytest.mark.parametrize("damage, says", [
    ("no weights", "cannot load the model (Error no file named model.safetensors"),
    ("cut weights", "a weights file is damaged or cut short"),
    ("garbage weights", "a weights file is damaged or cut short"),
    ("unknown architecture", "cannot load the model (The checkpoint you are trying to load has "
                             "model type `florbix`"),
])
def test_eval_of_a_damaged_model_folder_is_one_line(damage, says, hf, tmp_path, capsys):
    model = _copy(hf, tmp_path)
    st = model / "model.safetensors"
    if damage == "no weights":
        st.unlink()
    elif damage == "cut weights":
        st.write_bytes(st.read_bytes()[:2000])
    elif damage == "garbage weights":
        st.write_bytes(GARBAGE)
    else:
        cfg = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**cfg, "model_type": "florbix",
                                                       "architectures": ["FlorbixForCausalLM"]}))
    _one_error_line(capsys, _ppl(model, "--out", str(tmp_path / "r")), str(model), says)


@pytest.mark.parametrize("device, says", [("tpu9", "--device 'tpu9': not a device"),
                                          ("cuda:7", "--device cuda:7: torch sees")])
def test_eval_on_a_device_that_is_not_here_is_one_line(device, says, hf, tmp_path, capsys):
    rc = main(["eval", "ppl", "--model", hf, "--data", BOOKS, "--lengths", "32", "--device", device,
               "--out", str(tmp_path / "r"), "--no-progress"])
    _one_error_line(capsys, rc, says)


def test_eval_of_a_zst_that_is_not_zstd_is_one_line(hf, tmp_path, capsys):
    fake = tmp_path / "fake.jsonl.zst"
    fake.write_text('{"text": "not compressed"}\n')
    rc = main(["eval", "ppl", "--model", hf, "--data", str(fake), "--lengths", "32",
               "--device", "cpu", "--out", str(tmp_path / "r"), "--no-progress"])
    _one_error_line(capsys, rc, str(fake), "corrupt_stream")
    assert not (tmp_path / "r").exists()  # a failed evaluation leaves no empty results folder


@pytest.mark.parametrize("damage, says", [
    ("config garbage", "config.json: cannot import: not valid JSON"),
    ("config list", "config.json: cannot import: not a JSON object (a list)"),
    ("cut weights", "model.safetensors: cannot import: not a readable safetensors file"),
    ("garbage weights", "model.safetensors: cannot import: not a readable safetensors file"),
    ("garbage index", "model.safetensors.index.json: cannot import: not a safetensors index"),
    ("garbage tokenizer_config", "tokenizer_config.json: cannot import: not a JSON object"),
    ("garbage tokenizer.model", "tokenizer.model: not a SentencePiece model"),
])
def test_import_of_a_damaged_model_folder_is_one_line(damage, says, hf, tmp_path, capsys):
    model = _copy(hf, tmp_path)
    st = model / "model.safetensors"
    if damage == "config garbage":
        (model / "config.json").write_bytes(GARBAGE)
    elif damage == "config list":
        (model / "config.json").write_text("[1, 2]")
    elif damage == "cut weights":
        st.write_bytes(st.read_bytes()[:2000])
    elif damage == "garbage weights":
        st.write_bytes(GARBAGE)
    elif damage == "garbage index":
        (model / "model.safetensors.index.json").write_bytes(GARBAGE)
    elif damage == "garbage tokenizer.model":  # copied with exit 0 before; unusable later
        (model / "tokenizer.model").write_bytes(GARBAGE)
    else:
        (model / "tokenizer_config.json").write_bytes(GARBAGE)
    rc = main(["convert", "--from-hf", str(model), "--out", str(tmp_path / "run")])
    _one_error_line(capsys, rc, says, "nothing written")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ training's data cache
def test_a_data_cache_dir_under_a_file_is_one_line(tmp_path, gloo_1rank):
    from helpers import tiny_shard
    from lenext_dist.config import BlendItem, ConfigError, load_config
    from lenext_dist.data.gpt_data import build_datasets

    prefix = tiny_shard(str(tmp_path / "s_train"))
    (tmp_path / "afile").write_text("x")
    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}", "train.steps=4", "train.eval_interval=0",
                             f"data.cache_dir={tmp_path / 'afile' / 'cache'}"])
    cfg.data.blend = [BlendItem(prefix=prefix)]
    with pytest.raises(ConfigError, match=rf"^data.cache_dir: {tmp_path / 'afile' / 'cache'}: cannot "
                                          "be made a folder") as e:  # megatron's bare Exception before
        build_datasets(cfg, 1)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------ the scripts' own mains
def test_the_tokenizer_script_gives_one_line_for_a_path_under_a_file(tmp_path, capsys):
    """data_prep/train_tokenizer.py runs train_tokenizer_main without the entry-point wrapper."""
    from lenext_dist.prep.cli import train_tokenizer_main

    (tmp_path / "afile").write_text("x")
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"text": "a few words of text"}) + "\n")
    rc = train_tokenizer_main(["--input", str(docs), "--format", "jsonl",
                               "--model-prefix", str(tmp_path / "afile" / "spm")])
    _one_error_line(capsys, rc, str(tmp_path / "afile"), "a file where a folder is needed")


def test_the_gpu_check_gives_one_line_for_a_bad_out_dir_or_length(tmp_path, capsys):
    from lenext_dist.gpu.cli import main as gpu_main

    (tmp_path / "afile").write_text("x")
    config = f"{REPO}/configs/exp/tinyllama-1.1b-nope.yaml"
    rc = gpu_main(["--dry", "--config", config, "--out-dir", str(tmp_path / "afile" / "gpu")])
    _one_error_line(capsys, rc, str(tmp_path / "afile"))
    with pytest.raises(SystemExit) as e:
        gpu_main(["--dry", "--config", config, "--out-dir", str(tmp_path), "--long", "-5"])
    assert e.value.code == 2 and "argument --long: must be > 0" in capsys.readouterr().err


# ------------------------------------------------------------------ damaged side files
@pytest.mark.parametrize("content, says", [(GARBAGE, "JSONDecodeError"), (b'["a", "b"]', "ValueError"),
                                           (b'{"scales": [[1.0]]}', "KeyError: 'head_scales'")])
def test_head_scales_that_are_not_numbers_are_an_export_error(content, says, tmp_path):
    from lenext_dist.convert.export import ExportError, head_scales_from

    (tmp_path / "hs.json").write_bytes(content)
    with pytest.raises(ExportError, match=f"hs.json: not head scales \\({says}"):
        head_scales_from(tmp_path / "hs.json", 1, 1)


@pytest.mark.parametrize("content, says", [({"scales": [[1.0]]}, "a dict without 'head_scales'"),
                                           ([[1.0]], "a list"),
                                           ({"head_scales": [[1.0]]}, "its 'head_scales' is a list")])
def test_a_head_scales_pt_that_holds_no_tensor_is_an_export_error(content, says, tmp_path):
    """A .pt of a dict without head_scales, or of a list, raised KeyError / AttributeError."""
    import torch

    from lenext_dist.convert.export import ExportError, head_scales_from

    torch.save(content, tmp_path / "hs.pt")
    with pytest.raises(ExportError, match=f"hs.pt: not head scales \\({says}") as e:
        head_scales_from(tmp_path / "hs.pt", 1, 1)
    assert "\n" not in str(e.value)


def test_eval_with_a_damaged_tokenizer_config_names_it(hf, tmp_path, capsys):
    model = _copy(hf, tmp_path)
    (model / "tokenizer_config.json").write_bytes(GARBAGE)  # read for add_bos_token
    _one_error_line(capsys, _ppl(model, "--out", str(tmp_path / "r")),
                    str(model / "tokenizer_config.json"), "damaged")


def test_a_resume_moves_damaged_metrics_bytes_aside_as_they_are(tmp_path):
    from lenext_dist.train.metrics import Metrics

    good = b"".join(json.dumps({"step": s, "loss": 1.0}).encode() + b"\n" for s in (1, 2, 3))
    (tmp_path / "metrics.jsonl").write_bytes(good + GARBAGE[128:200] + b"\n")  # not UTF-8
    Metrics(str(tmp_path), 20, 1, 1.0, 1.0, 1, tensorboard=False, enabled=True, start_step=3).close()
    assert (tmp_path / "metrics.jsonl").read_bytes() == good
    assert (tmp_path / "metrics.dropped-1.jsonl").read_bytes() == GARBAGE[128:200] + b"\n"


def test_prep_merge_with_a_damaged_plan_is_one_line(tmp_path, capsys):
    (tmp_path / "x.parts").mkdir()
    (tmp_path / "x.parts" / "plan.json").write_bytes(GARBAGE)
    rc = main(["prep", "merge", "--out", str(tmp_path), "--name", "x"])
    _one_error_line(capsys, rc, str(tmp_path / "x.parts" / "plan.json"), "damaged")


def test_a_model_states_file_without_module_is_a_checkpoint_error(megatron_1rank, tmp_path, monkeypatch):
    """A file that torch loads (weights only) but DeepSpeed did not write: the export's reader and
    a resume (DeepSpeed's own load) each name it; KeyError('module') before."""
    import torch

    from lenext_dist.checkpoint.weights import read_state
    from lenext_dist.config import load_config
    from lenext_dist.model import build_model
    from lenext_dist.train import checkpoint, optim
    from lenext_dist.train.loop import skip_deepspeed_shm_op

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}", "model.num_layers=1", "model.hidden_size=32",
                             "model.num_attention_heads=2", "model.ffn_hidden_size=64",
                             "model.vocab_size=256", "model.seq_length=16", "train.precision=fp32",
                             "parallel.zero_stage=1", "train.micro_batch_size=1",
                             "train.global_batch_size=1"])
    skip_deepspeed_shm_op()
    engine = optim.build_engine(build_model(cfg, device="cpu"), cfg, 1)
    checkpoint.save(engine, cfg, 1, 1)
    step = tmp_path / "run" / "checkpoints" / "step_0000001"
    torch.save({"x": torch.ones(2)}, step / "mp_rank_00_model_states.pt")
    with pytest.raises(CheckpointError, match=f"^{step}: a checkpoint file lacks 'module'"):
        checkpoint.load(engine, str(step.parent), step.name)
    with pytest.raises(CheckpointError, match="mp_rank_00_model_states.pt: not a DeepSpeed model states"):
        read_state(step)  # read before DeepSpeed's zero_to_fp32 (a ValueError there, once)
    for f in step.glob("*_optim_states.pt"):
        f.unlink()  # the layout of an import (module states only)
    with pytest.raises(CheckpointError, match="mp_rank_00_model_states.pt: not a DeepSpeed model states"):
        read_state(step)


def test_a_yaml_syntax_error_is_one_line_with_its_line_and_column(tmp_path):
    from lenext_dist.config import ConfigError, load_config

    (tmp_path / "c.yaml").write_text("train:\n  steps: [1, 2\n  lr: }\n")
    with pytest.raises(ConfigError, match=r"c.yaml: not valid YAML: line 3, column 5: expected ',' "
                                          r"or '\]', but got ':' \(while parsing a flow sequence\)$") as e:
        load_config(tmp_path / "c.yaml")  # PyYAML's 7 lines with caret drawings before
    assert "\n" not in str(e.value)


def test_extend_of_a_base_that_is_not_a_run_makes_no_folder(tmp_path, capsys):
    rc = main(["extend", "--base", str(tmp_path / "nope"), "--targets", "256"])
    _one_error_line(capsys, rc, str(tmp_path / "nope" / "checkpoints"))
    assert not (tmp_path / "nope").exists()  # <base>/extend was made before the check


def test_a_report_of_a_folder_without_results_is_one_line(tmp_path, capsys):
    """A parent folder or a typo'd sibling among --runs: a report without it would look complete."""
    good, empty = tmp_path / "good", tmp_path / "empty"
    good.mkdir()
    empty.mkdir()
    (good / "r.json").write_text(json.dumps({"kind": "some future kind"}))
    (empty / "notes.json").write_text(json.dumps({"no": "kind"}))
    rc = main(["report", "--runs", str(good), str(empty), "--out", str(tmp_path / "r.md")])
    _one_error_line(capsys, rc, str(empty), "holds no `lenext eval` result")
    assert not (tmp_path / "r.md").exists()
    assert main(["report", "--runs", str(good), "--out", str(tmp_path / "r.md")]) == 0
