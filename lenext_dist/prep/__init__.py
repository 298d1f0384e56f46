"""Data preparation: raw corpora -> megatron-core indexed shards + manifest.

Modules (one concern each):
  readers          streaming readers (SlimPajama jsonl.zst, Starcoderdata parquet, jsonl, txt)
  tokenizer        SentencePiece encoding (+EOS), token dtype, stable train/valid split
  worker           one input file -> partial shards + done-record (atomic, resumable)
  merge            partials -> <name>_<split>.bin/.idx via IndexedDatasetBuilder.add_index
  manifest         plan, done-records, manifest.json
  runner           the shard step: task slicing (Slurm arrays), worker pool, progress bar
  train_tokenizer  a Llama-style SentencePiece model trained on a corpus sample
  sample_corpus    the embedded real-text sample corpus under data/sample
  cli              command lines used by data_prep/*.py
"""
