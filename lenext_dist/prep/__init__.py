"""Data preparation: raw corpora -> megatron-core indexed shards + manifest.

Modules (one concern each):
  readers          streaming readers (SlimPajama jsonl.zst, Starcoderdata parquet, jsonl, txt)
  tokenizer        SentencePiece encoding (+EOS), token dtype, stable train/valid split
  units            units of work: .jsonl byte ranges, parquet row groups, whole files
  worker           one unit -> partial shards + done-record (atomic, resumable)
  pool             forked workers; a dead worker is an error naming its unit
  lock             flock on <out>/<name>.parts: one run at a time
  mcore_io         megatron's IndexedDatasetBuilder without the megatron.core package (no torch)
  merge            partials -> <name>_<split>.bin/.idx (add_index's bytes, streamed)
  manifest         plan, done-records, manifest.json, input change detection
  runner           the shard step: task slicing (Slurm arrays), worker pool, progress bar
  train_tokenizer  a Llama-style SentencePiece model trained on a corpus sample
  sample_corpus    the embedded real-text sample corpus under data/sample
  cli              `lenext prep VERB` (and the data_prep/*.py aliases)
"""
