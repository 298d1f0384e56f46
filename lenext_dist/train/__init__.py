"""Training: DeepSpeed engine loop, checkpoints, metrics, signals, the HeadScale mode.

`python -m lenext_dist.train` is one rank of a run (cli.py, which also holds `lenext train`);
launch.py builds the one launch command of N local ranks."""
