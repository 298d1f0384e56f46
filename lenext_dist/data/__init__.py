"""Training data from megatron indexed shards (GPTDataset + weighted blend), resumable by index."""
