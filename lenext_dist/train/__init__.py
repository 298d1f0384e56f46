"""Training: DeepSpeed engine loop, checkpoints, metrics, signals, the HeadScale mode."""
