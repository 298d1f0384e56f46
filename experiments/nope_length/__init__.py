"""The NoPE length-generalization study in the synthetic key-value regime (see README.md)."""
