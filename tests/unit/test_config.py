"""The typed config tree: strict YAML, includes, overrides, validation, the DeepSpeed JSON."""
import re

import pytest
import yaml

from lenext_dist.config import ConfigError, deepspeed_config, load_config, save_config, split_cli_overrides
from lenext_dist.config.load import safe_yaml


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if isinstance(data, dict) else data)
    return p


def test_every_shipped_config_loads(repo):
    paths = sorted((repo / "configs").rglob("*.yaml"))
    assert len(paths) >= 5
    for p in paths:
        assert isinstance(safe_yaml(p.read_text(), str(p)), dict)  # no repeated key, not empty
        if p.parent.name == "exp":
            cfg = load_config(p)
            assert cfg.name == p.stem


def test_include_merge_and_override_order(tmp_path):
    write(tmp_path, "base.yaml", {"model": {"num_layers": 3, "hidden_size": 64}, "optim": {"lr": 0.1}})
    p = write(tmp_path, "exp.yaml", {"include": ["base.yaml"], "model": {"num_layers": 5}})
    cfg = load_config(p, ["optim.lr=3e-4", "train.steps=7"])
    assert (cfg.model.num_layers, cfg.model.hidden_size) == (5, 64)
    assert cfg.optim.lr == 3e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.train.steps == 7


def test_unknown_key_names_key_and_file(tmp_path):
    p = write(tmp_path, "bad.yaml", {"train": {"micro_batch_sise": 4}})
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "train.micro_batch_sise" in msg and str(p) in msg and "micro_batch_size" in msg


def test_unknown_key_in_included_file_names_that_file(tmp_path):
    inc = write(tmp_path, "inc.yaml", {"model": {"hidden": 64}})
    p = write(tmp_path, "exp.yaml", {"include": ["inc.yaml"]})
    with pytest.raises(ConfigError, match=f"{inc}.*model.hidden"):
        load_config(p)


def test_missing_required_key_names_key_and_file(tmp_path):
    p = write(tmp_path, "exp.yaml", {"data": {"blend": [{"weight": 0.5}]}})
    with pytest.raises(ConfigError, match=rf"{p}: data\.blend\[0\]\.prefix: required key missing"):
        load_config(p)


@pytest.mark.parametrize("override,key", [
    ("train.steps=ten", "train.steps"),
    ("train.steps=1.5", "train.steps"),
    ("optim.lr=true", "optim.lr"),
    ("train.precision=fp8", "train.precision"),
    ("attention.position=spiral", "attention.position"),
    ("parallel.zero_stage=4", "parallel.zero_stage"),
    ("model.hidden_size=65", "model.hidden_size"),
    ("train.global_batch_size=10", "train.global_batch_size"),  # micro 4 does not divide 10
    ("train.exit_at=201", "train.exit_at"),  # past train.steps (200)
    ("train.exit_at=-1", "train.exit_at"),
    # NaN / inf pass `> 0` checks (a run then "diverges"): every float key refuses them
    ("optim.lr=inf", "optim.lr: must be a finite number"),
    ("optim.lr=1e999", "optim.lr: must be a finite number"),
    ("optim.weight_decay=nan", "optim.weight_decay: must be >= 0 (0: no decay), got nan"),
    ("model.norm_epsilon=.nan", "model.norm_epsilon: must be a finite number, got nan"),
    ("logging.peak_tflops=.inf", "logging.peak_tflops: must be a finite number, got inf"),
    ("logging.peak_tflops=0", "logging.peak_tflops: must be > 0"),  # MFU was logged negative / inf
    ("parallel.backend=ncc", "parallel.backend: must be one of ['nccl', 'gloo'], got 'ncc'"),  # torch asserted
    ("attention.scale_c=inf", "attention.scale_c: must be a finite number"),
    ("attention.head_scale.init=.inf", "attention.head_scale.init: must be a finite number"),
    ("optim.eps=-1", "optim.eps: must be > 0 (AdamW divides by sqrt(v) + eps), got -1.0"),
    ("optim.eps=0", "optim.eps: must be > 0"),
    ("optim.weight_decay=-0.1", "optim.weight_decay: must be >= 0"),
    ("data.blend=[{prefix: a, weight: .inf}, {prefix: b, weight: 1}]", r"data.blend[0].weight: must be a finite"),
    ("data.blend=[{prefix: a, weight: 1.0e+308}, {prefix: b, weight: 1.0e+308}]", "data.blend: the weights sum"),
    ("data.valid_blend=[{prefix: a, weight: 1.0e+308}, {prefix: b, weight: 1.0e+308}]", "data.valid_blend:"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=re.escape(key)) as e:
        load_config(None, ["train.micro_batch_size=4", override])
    assert "\n" not in str(e.value)


def test_batch_arithmetic_checked_against_world_size():
    cfg = load_config(None, ["train.micro_batch_size=2", "train.global_batch_size=8"])
    assert cfg.train.accum_steps(1) == 4 and cfg.train.accum_steps(2) == 2
    with pytest.raises(ConfigError, match="train.global_batch_size"):
        cfg.train.accum_steps(3)
    cfg = load_config(None, ["train.micro_batch_size=2", "train.global_batch_size=8", "train.grad_accum=3"])
    with pytest.raises(ConfigError, match="train.grad_accum"):
        cfg.train.accum_steps(1)


def test_headscale_mode_requires_trainable_scales_and_source():
    with pytest.raises(ConfigError, match="train.mode"):
        load_config(None, ["train.mode=headscale"])
    with pytest.raises(ConfigError, match="checkpoint.init_from"):
        load_config(None, ["train.mode=headscale", "attention.head_scale.enabled=true",
                           "attention.head_scale.trainable=true"])


def test_settings_deepspeed_cannot_honour_name_the_key():
    with pytest.raises(ConfigError, match=r"parallel\.offload_optimizer"):
        load_config(None, ["parallel.zero_stage=0", "parallel.offload_optimizer=true"])
    clamped = ["attention.head_scale.enabled=true", "attention.head_scale.trainable=true",
               "attention.head_scale.min_value=1.0", "train.precision=bf16"]
    with pytest.raises(ConfigError, match=r"parallel\.zero_stage"):
        load_config(None, [*clamped, "parallel.zero_stage=0"])
    load_config(None, [*clamped, "parallel.zero_stage=1"])  # ZeRO 1-3 masters are clamped


def test_cli_override_forms():
    assert split_cli_overrides(["--optim.lr=3e-4", "--train.steps", "5", "name=x"]) == [
        "optim.lr=3e-4", "train.steps=5", "name=x"]


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["model.num_layers=3", "data.blend=[{prefix: a, weight: 0.5}]"])
    save_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg


def test_deepspeed_json_from_config():
    cfg = load_config(None, ["train.micro_batch_size=2", "train.global_batch_size=8",
                             "parallel.zero_stage=3", "train.precision=bf16", "optim.grad_clip=0.5"])
    ds = deepspeed_config(cfg, world_size=2)
    assert ds["train_batch_size"] == 8 and ds["gradient_accumulation_steps"] == 2
    assert ds["train_micro_batch_size_per_gpu"] == 2
    assert ds["zero_optimization"]["stage"] == 3 and ds["bf16"]["enabled"] is True
    assert ds["gradient_clipping"] == 0.5
    assert "offload_optimizer" not in ds["zero_optimization"]
    offload = deepspeed_config(load_config(None, ["parallel.offload_optimizer=true"]), world_size=1)
    # pinned: pageable host buffers halve the copies' bandwidth and cannot overlap the step on a GPU
    assert offload["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}


def test_config_reference_page_is_current(repo):
    """docs/configuration.md's key table is generated from schema.py; regenerate with
    `python -m lenext_dist.config.docs --write` after changing a field."""
    from lenext_dist.config.docs import PAGE, readme_block, reference

    assert readme_block(repo / PAGE) == reference(), \
        "docs/configuration.md is out of date: run python -m lenext_dist.config.docs --write"


def test_include_bomb_and_include_depth_are_bounded(tmp_path):
    """Each file including the next twice reads 2^depth files; a chain of includes nests without
    end: both stop at once with one line naming the top file."""
    for i in range(12):
        write(tmp_path, f"f{i}.yaml", f"include: [f{i + 1}.yaml, f{i + 1}.yaml]\n")
    write(tmp_path, "f12.yaml", "name: x\n")
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'f0.yaml'}: more than \d+ config files read"):
        load_config(tmp_path / "f0.yaml")
    for i in range(40):
        write(tmp_path, f"c{i}.yaml", f"include: c{i + 1}.yaml\n")
    write(tmp_path, "c40.yaml", "name: x\n")
    with pytest.raises(ConfigError, match=r"includes nested more than \d+ deep"):
        load_config(tmp_path / "c0.yaml")


def test_deeply_nested_yaml_is_a_config_error_not_a_recursion_error(tmp_path):
    p = write(tmp_path, "deep.yaml", "train: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(ConfigError, match=rf"{p}: mappings/lists nested more than \d+ deep"):
        load_config(p)
    with pytest.raises(ConfigError, match="override train.steps: mappings/lists nested"):
        load_config(None, ["train.steps=" + "{a: " * 5_000 + "1" + "}" * 5_000])


@pytest.mark.parametrize("name", ["../..", "", ".", "..", "a/b", "/etc"])
def test_a_name_that_is_no_plain_folder_is_refused(name):
    """runs/<name> must be a folder of runs/ (issue 40: '../..', '', '.' gave run folders outside
    their own); with run_dir set, the name is free text again."""
    with pytest.raises(ConfigError, match=r"name: .* is not a plain folder name") as e:
        load_config(None, [f"name='{name}'"])
    assert "\n" not in str(e.value)
    assert load_config(None, [f"name='{name}'", "run_dir=/tmp/r"]).run_dir == "/tmp/r"


def test_a_plain_name_gives_its_runs_folder():
    assert load_config(None, ["name=tiny.v2_a-1"]).run_dir == "runs/tiny.v2_a-1"


def test_an_override_behind_a_check_of_another_key_is_named_beside_the_file(tmp_path):
    """issue 40: a check across keys failed through a command-line override was blamed on the
    YAML file alone."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train: {global_batch_size: 8}\n")
    with pytest.raises(ConfigError) as e:
        load_config(cfg, ["train.micro_batch_size=3"])
    msg = str(e.value)
    assert msg.startswith(f"{cfg} with the command line's train.micro_batch_size=3: "
                          "train.global_batch_size: 8 is not a multiple") and "\n" not in msg
    cfg.write_text("train: {global_batch_size: 7, micro_batch_size: 2}\n")
    with pytest.raises(ConfigError, match=rf"^{cfg}: train.global_batch_size"):  # no override: the file
        load_config(cfg, [])


def test_a_repeated_key_is_refused_with_file_line_and_key(tmp_path):
    """PyYAML keeps the last of two equal keys: a second `train:` section dropped the first unseen."""
    p = write(tmp_path, "c.yaml", "train:\n  steps: 3\noptim:\n  lr: 0.1\ntrain:\n  micro_batch_size: 2\n")
    with pytest.raises(ConfigError, match=rf"^{p}: line 5: key 'train' given twice in one mapping") as e:
        load_config(p)
    assert "\n" not in str(e.value)
    p = write(tmp_path, "d.yaml", "optim: {lr: 0.1, beta1: 0.8, lr: 0.2}\n")  # inside a section
    with pytest.raises(ConfigError, match=rf"^{p}: line 1: key 'lr' given twice"):
        load_config(p)
    with pytest.raises(ConfigError, match=r"override data.blend: line 1: key 'prefix' given twice"):
        load_config(None, ["data.blend=[{prefix: a, prefix: b}]"])
    # one node under two aliases, and a `<<` merge overridden: no repeated key
    assert safe_yaml("a: &x {lr: 1}\nb: *x\nc: {<<: *x, lr: 2}\n", "t") == {
        "a": {"lr": 1}, "b": {"lr": 1}, "c": {"lr": 2}}


@pytest.mark.parametrize("text, says", [
    ("", "empty; a config is a YAML mapping"),
    ("# only a comment\n", "empty; a config is a YAML mapping"),
    ("0\n", "top level must be a mapping of sections, got int 0"),
    ("false\n", "top level must be a mapping of sections, got bool False"),
    ("- train\n", "top level must be a mapping of sections, got list"),
])
def test_an_empty_or_non_mapping_config_file_is_refused(tmp_path, text, says):
    """They were taken for the built-in defaults (a run of something else than the user meant)."""
    p = write(tmp_path, "c.yaml", text)
    with pytest.raises(ConfigError, match=rf"^{p}: {re.escape(says)}"):
        load_config(p)


def test_an_empty_config_path_names_the_flag_and_none_means_the_defaults():
    for path in ("", " "):
        with pytest.raises(ConfigError, match=r"^--config '': no file named"):
            load_config(path)
    assert load_config(None).optim.lr == load_config(None, []).optim.lr > 0  # None: the defaults
