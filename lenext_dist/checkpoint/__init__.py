"""The checkpoint format: what training writes and every later stage reads.

Training (lenext_dist/train/checkpoint.py) writes it; convert, extend and the cluster job scripts
read it. It lives below all of them so that a reader never imports the trainer (imports run one
way along the pipeline prep -> data -> train -> convert -> eval -> extend, tests/unit/
test_import_cycles.py) and the names (`latest`, COMPLETE, step_NNNNNNN, config.yaml) are spelled
once:
    layout.py     names and locating a complete step (no torch: job scripts import it)
    weights.py    a step's model weights, in one process, at any ZeRO stage
    safe_load.py  every torch.load of a checkpoint is weights_only
"""
