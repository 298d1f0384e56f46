"""Training data: megatron-core GPTDataset over .bin/.idx shards, blended by weight.

Exact resume without replay: the blend is a deterministic function of (shards, seed, sizes), and
global sample `n` is read by index, so a run that has consumed `n` samples continues at `n`.
Batch layout: optimizer step t owns the global samples [t*G, (t+1)*G), G = global batch; inside
it, micro-batch m of data-parallel rank r reads [t*G + (m*W + r)*B, ... + B) (B = micro batch, W =
world size). Any world size with the same G therefore sees the same samples in each step, which is
what makes loss curves comparable across rank counts and resumable at another rank count. A
length stage of train.stages has a dataset of its own, sized for its steps, and counts t from its
first step (config/stages.py).

BOS (`data.bos`): added when samples are built, not in the shards. `BosDocuments` shows megatron
each shard document as [BOS] + tokens (its sequence lengths + 1), so GPTDataset packs, shuffles and
cuts documents exactly as it would have had the shards been written with BOS; shards need no
re-tokenization and stay valid both ways. The BOS id joins the tokenizer's identifiers, so
megatron's cached sample indices of a run without BOS are never reused with it.

Answer loss (`data.task_loss: answers`): shards of generated task documents carry an answer mask
beside them (`<prefix>_answers`, same document lengths); megatron's own sample walk over it gives
each sample's mask, and the loss mask keeps the answer tokens only. Text shards are unchanged.
A shard is text when its manifest says so or its blend item says `text: true`: a shard with neither
a mask nor such word (a task shard copied without its mask) is refused, not trained on its filler.
Before megatron builds, each mask is checked against its shard (present when the shard's manifest
says --format tasks, whole, uint8, the same document lengths, some answer token); the run records
the masks' sha256 in <run_dir>/data_inputs.json and warns when its first steps hold no answer.

Sample-index cache (`data.cache_dir`, default <run_dir>/data_cache): megatron reads it with
numpy.load(allow_pickle=True); each file it loads must be plain data and is loaded without pickle,
and each file it saves appears whole (data/sample_cache.py), so a copied or shared run folder
cannot run code and ranks or runs sharing a cache never read a file in the making. Cache names
hash each shard's build (shard_identity) beside megatron's own key, its path: a shard remade in
place gets new indices, and a resumed run says so (data_inputs.json records the builds read).

Document masking (`data.document_mask`): each micro-batch also carries `document_ids` [b, s]
(split after EOS and at BOS, lenext_dist.attention.document_ids), handed to the model as its
attention mask.

Loader workers (`data.loader_workers`, default 1 on an accelerator, 0 on the CPU): a torch
DataLoader over `StepBatches` builds the next steps' micro-batches in forked processes while the
device computes (on a GPU the batch was otherwise built in the step's own time); the order is the
generator's, so resume stays exact. Workers outlive the stop signals meant for the training process
(workers.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch

from lenext_dist.atomic import atomic_write
from lenext_dist.config import BlendItem, ConfigError, RunConfig
from lenext_dist.prep.manifest import ANSWERS_SUFFIX, answers_prefix, shard_manifest
from lenext_dist.prep.mcore_io import IDX_DTYPES, IDX_HEAD, IDX_MAGIC

from .sample_cache import no_pickle, regular_cache_files
from .workers import worker_batches


@dataclass
class ShardTokenizer:
    """What megatron's GPTDataset needs of a tokenizer: the end-of-document id and vocab size.

    `pad` is deliberately absent: megatron then uses its own out-of-vocabulary pad id (-1), which
    can never collide with a real token.
    """

    eod: int
    vocab_size: int
    bos: Optional[int] = None  # put before every document when set (data.bos)
    shards: dict[str, str] = field(default_factory=dict)  # {prefix: shard_identity}

    @property
    def unique_identifiers(self) -> dict:
        """Part of megatron's dataset description, hashed into the sample-index cache names.
        Megatron names a cache by the shard's path, not its contents, so a shard remade at the
        same path (`make task-shards` into a resumed run's blend) had its old indices reused:
        an IndexError, or samples cut at the old documents' bounds. The tokenizer's identifiers
        are the one part of a GPTDatasetConfig megatron hashes that can carry the shards'."""
        ids = {"class": type(self).__name__, "eod": self.eod, "vocab_size": self.vocab_size}
        if self.bos is not None:  # absent without BOS: earlier runs' cache names stay the same
            ids["bos"] = self.bos
        if self.shards:
            ids["shards"] = self.shards
        return ids

    @classmethod
    def from_sentencepiece(cls, path: str, bos: bool = False) -> "ShardTokenizer":
        from lenext_dist.prep.tokenizer import load_sentencepiece

        if not Path(path).is_file():
            raise ConfigError(f"data.tokenizer: {path}: no such SentencePiece model")
        sp = load_sentencepiece(str(path), "data.tokenizer")
        if bos and sp.bos_id() < 0:
            raise ConfigError(f"data.bos: {path} has no BOS piece (bos_id -1); set data.bos "
                              "false or train the tokenizer with a BOS (`lenext prep tokenizer` does)")
        return cls(eod=sp.eos_id(), vocab_size=sp.get_piece_size(),
                   bos=sp.bos_id() if bos else None)


class BosDocuments:
    """A megatron IndexedDataset whose every document reads as [bos] + its tokens.

    What GPTDataset uses of a low-level dataset: `sequence_lengths` (int32, one more per
    document), `get(idx, offset, length)` (token offset 0 is the BOS), `path_prefix`, len().
    """

    def __init__(self, inner, bos: int):
        import numpy as np

        self.inner, self.bos = inner, int(bos)
        self.sequence_lengths = (inner.sequence_lengths + 1).astype(np.int32)
        self.path_prefix = inner.path_prefix

    def __len__(self) -> int:
        return len(self.inner)

    def get(self, idx: int, offset: int = 0, length: Optional[int] = None):
        import numpy as np

        if length is None:
            length = int(self.sequence_lengths[idx]) - offset
        if offset > 0:
            return self.inner.get(idx, offset - 1, length)
        rest = self.inner.get(idx, 0, length - 1) if length > 1 else np.zeros(0, np.int64)
        return np.concatenate((np.asarray([self.bos], dtype=rest.dtype), rest))[:length]


def _gpt_dataset_class(answer_loss: bool = False):
    """megatron's GPTDataset, with `BosDocuments` under it when the tokenizer carries a BOS, and
    with `answer_loss` the loss mask of shards that have an answer mask beside them (generated
    task documents: prep/manifest.answers_prefix) cut to their answer tokens."""
    from megatron.core.datasets.gpt_dataset import GPTDataset
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    class LenextGPTDataset(GPTDataset):
        @staticmethod
        def build_low_level_dataset(dataset_path, config):
            inner = GPTDataset.build_low_level_dataset(dataset_path, config)
            bos = config.tokenizer.bos
            docs = inner if bos is None else BosDocuments(inner, bos)
            mask_prefix = answers_prefix(dataset_path)
            if answer_loss and os.path.isfile(mask_prefix + ".idx"):
                # the same document lengths as the shard: megatron's own sample walk over it
                # (`_answer_mask`) lines its values up with the tokens; the BOS is no answer
                mask = IndexedDataset(mask_prefix, multimodal=False, mmap=config.mmap_bin_files)
                docs.answer_mask = mask if bos is None else BosDocuments(mask, 0)
            return docs

        def __getitem__(self, idx):
            sample = super().__getitem__(idx)
            masks = getattr(self.dataset, "answer_mask", None)
            if masks is None:
                return sample
            # [s + 1] mask values of the sample's tokens (megatron pads with -1): labels are
            # tokens[1:], so the loss mask of label j is the mask of token j + 1
            answer = torch.from_numpy(self._answer_mask(0 if idx is None else idx, masks))
            return {**sample, "loss_mask": sample["loss_mask"] * (answer[1:] == 1)}

        def _answer_mask(self, idx: int, masks):
            tokens = self.dataset
            self.dataset = masks  # megatron's walk reads self.dataset.get(doc, offset, length)
            try:
                return self._query_document_sample_shuffle_indices(idx)[0]
            finally:
                self.dataset = tokens

    return LenextGPTDataset


def check_prefixes(items: list[BlendItem], key: str) -> None:
    for it in items:
        for ext in (".bin", ".idx"):
            if not os.path.isfile(it.prefix + ext):
                raise ConfigError(
                    f"{key}: shard {it.prefix}{ext} not found (make shards with "
                    f"`lenext prep`, or fix the prefix)")
        _check_sizes(it.prefix, key)


def _check_sizes(prefix: str, key: str) -> tuple[int, np.ndarray, np.ndarray]:
    """A truncated shard (an interrupted copy) or an empty one is named here, not by a numpy
    error in megatron. Returns its dtype code, sequence lengths and document indices."""
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    again = "copy it again, or rebuild it with `lenext prep`"
    with open(idx, "rb") as f:
        head = f.read(IDX_HEAD)
    if len(head) < IDX_HEAD or head[:9] != IDX_MAGIC or head[17] not in IDX_DTYPES:
        raise ConfigError(f"{key}: {idx}: not a megatron index (truncated or another format); {again}")
    seqs, docs = struct.unpack("<QQ", head[18:34])
    need = IDX_HEAD + 12 * seqs + 8 * docs
    if os.path.getsize(idx) < need:
        raise ConfigError(f"{key}: {idx}: {os.path.getsize(idx):,} bytes, its header needs {need:,} "
                          f"(truncated); {again}")
    if not seqs or not os.path.getsize(bin_):  # megatron cannot memory-map an empty .bin
        raise ConfigError(f"{key}: {prefix}.bin/.idx: an empty shard (no tokens); drop it from "
                          f"{key}, or remake it from more input")
    lengths = np.memmap(idx, np.int32, "r", offset=IDX_HEAD, shape=(seqs,))
    pointers = np.memmap(idx, np.int64, "r", offset=IDX_HEAD + 4 * seqs, shape=(seqs,))
    end = int(pointers[-1]) + int(lengths[-1]) * np.dtype(IDX_DTYPES[head[17]]).itemsize
    if os.path.getsize(bin_) < end:
        raise ConfigError(f"{key}: {bin_}: {os.path.getsize(bin_):,} bytes, its index {idx} needs "
                          f"{end:,} (truncated); {again}")
    return head[17], lengths, np.memmap(idx, np.int64, "r", offset=IDX_HEAD + 12 * seqs, shape=(docs,))


def _check_answers(items: list[BlendItem], key: str) -> dict[str, dict]:
    """data.task_loss: answers: the answer mask of each shard that has one, or that its manifest
    says holds task documents, must be whole, uint8, of the shard's very documents, and hold an
    answer token. Returns {mask prefix: sha256 of its .bin and .idx}."""
    masks = {}
    for it in items:
        mask = answers_prefix(it.prefix)
        made = shard_manifest(it.prefix)
        fmt = made[1].get("settings", {}).get("format") if made is not None else None
        tasks = fmt == "tasks"
        has_mask = os.path.isfile(mask + ".bin") or os.path.isfile(mask + ".idx")
        remake = ("copy it beside its shard again, or remake both (`make task-shards`, or "
                  "`lenext prep --format tasks`)")
        if it.text and (tasks or has_mask):
            said = (f"its manifest {made[0]} says --format tasks" if tasks
                    else f"{mask}.bin/.idx lies beside it")
            raise ConfigError(f"{key}: {it.prefix} is marked `text: true` but is a task shard "
                              f"({said}); drop `text: true` to train on its answers, or set "
                              "data.task_loss 'all'")
        if not (tasks or has_mask):
            if it.text or made is not None:
                continue  # a text shard (said by the config or by its manifest): every token trains
            # the data says nothing: a task shard copied without its mask and manifest would
            # train on all its filler tokens unnoticed
            raise ConfigError(f"{key}: {it.prefix} has no answer mask ({mask}.bin/.idx) and no "
                              "manifest beside it saying it is text: under data.task_loss 'answers' "
                              "copy its mask beside it (or remake both: `make task-shards`), or, "
                              "for a text shard that trains on all its tokens, add `text: true` "
                              "to its blend item")
        for ext in (".bin", ".idx"):
            if not os.path.isfile(mask + ext):
                said = f" (its manifest {made[0]} says --format tasks)" if tasks else ""
                raise ConfigError(f"{key}: answer mask {mask}{ext} of the task shard {it.prefix} "
                                  f"not found{said}; {remake}, or set data.task_loss 'all'")
        code, lengths, docs = _check_sizes(mask, f"{key}: answer mask")
        if code != 1:
            raise ConfigError(f"{key}: answer mask {mask}.idx holds {np.dtype(IDX_DTYPES[code])} "
                              f"values, not uint8 (1 on answer tokens); {remake}")
        _, want, want_docs = _check_sizes(it.prefix, key)
        if not (np.array_equal(lengths, want) and np.array_equal(docs, want_docs)):
            raise ConfigError(
                f"{key}: answer mask {mask}.idx does not fit its shard {it.prefix}.idx ({len(lengths):,} "
                f"documents of {int(lengths.sum()):,} tokens, the shard {len(want):,} of "
                f"{int(want.sum()):,}, or other lengths): a mask of other shards (another "
                f"--task-seed?); {remake}")
        sha, answers = hashlib.sha256(), False
        with open(mask + ".bin", "rb") as f:
            while chunk := f.read(1 << 24):
                sha.update(chunk)
                answers = answers or b"\x01" in chunk
        if not answers:
            raise ConfigError(f"{key}: answer mask {mask}.bin marks no answer token (all 0): "
                              f"data.task_loss 'answers' would train on nothing there; {remake}")
        with open(mask + ".idx", "rb") as f:
            masks[mask] = {"bin_sha256": sha.hexdigest(), "idx_sha256": hashlib.sha256(f.read()).hexdigest()}
    return masks


def _first_answers(dataset, cfg: RunConfig) -> tuple[int, int]:
    """(loss tokens, samples) of the first steps (at most 4) of `dataset`."""
    t = cfg.train
    n = min(len(dataset), t.global_batch_size * min(t.steps, 4))
    return sum(int(dataset[i]["loss_mask"].sum()) for i in range(n)), n


def _blend(items: list[BlendItem]) -> Optional[tuple[list[str], Optional[list[float]]]]:
    if not items:
        return None
    # One source: weights None (megatron rejects a weight list with a None size, and it means 1.0)
    return [i.prefix for i in items], ([i.weight for i in items] if len(items) > 1 else None)


def shard_identity(prefix: str) -> str:
    """Which build of the shard `prefix` this is: its .idx's size and modification time (sample
    indices depend on the document lengths alone, and a remade shard is a new .idx). A copy that
    does not keep times (cp without -p) reads as another build: its indices are built again."""
    st = os.stat(prefix + ".idx")
    return f"{st.st_size}-{st.st_mtime_ns}"


def shard_identities(d) -> dict[str, str]:
    """{absolute prefix: shard_identity} of data.blend and data.valid_blend."""
    return {os.path.abspath(b.prefix): shard_identity(b.prefix) for b in [*d.blend, *d.valid_blend]}


def check_shards(d, blend_key: str = "data.blend") -> dict[str, dict]:
    """What megatron would fail on, or train wrongly on, in the shards of the data config `d`
    (data.blend, data.valid_blend; `blend_key` names the blend in errors, e.g. a stage's): each
    shard whole, and under data.task_loss 'answers' each answer mask (_check_answers) and at
    least one. Returns {mask prefix: sha256 of its .bin and .idx} (empty without answers)."""
    if not d.blend:
        raise ConfigError(f"{blend_key}: no training shards configured")
    check_prefixes(d.blend, blend_key)
    check_prefixes(d.valid_blend, "data.valid_blend")
    if d.task_loss != "answers":
        return {}
    masks = {**_check_answers(d.blend, blend_key), **_check_answers(d.valid_blend, "data.valid_blend")}
    if not any(answers_prefix(b.prefix) in masks for b in d.blend):
        raise ConfigError(f"data.task_loss: 'answers', but no shard of {blend_key} has an answer mask "
                          f"beside it (<prefix>{ANSWERS_SUFFIX}.bin/.idx, written by `lenext prep "
                          "--format tasks`): remake the task shards (`make task-shards`) or set 'all'")
    return masks


def build_datasets(cfg: RunConfig, world_size: int, record: bool = False, steps: Optional[int] = None):
    """(train, valid or None) megatron datasets, the training one sized for `steps` optimizer steps
    (default train.steps: the whole run; a length stage: its own steps, config/stages.py); call on
    every rank. `record` (rank 0 of a run): write <run_dir>/data_inputs.json, the blends and the
    sha256 of the answer masks read."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    d, t = cfg.data, cfg.train
    masks = check_shards(d)
    tok = ShardTokenizer.from_sentencepiece(d.tokenizer, bos=d.bos)
    tok.shards = shard_identities(d)
    if tok.vocab_size > cfg.model.vocab_size:
        raise ConfigError(f"model.vocab_size: {cfg.model.vocab_size} < tokenizer vocabulary "
                          f"{tok.vocab_size} ({d.tokenizer})")
    n_evals = t.steps // t.eval_interval + 1 if t.eval_interval else 0
    valid_samples = n_evals * t.eval_iters * t.global_batch_size if d.valid_blend else None  # valid_batches
    cache = d.cache_dir or os.path.join(cfg.run_dir, "data_cache")
    gcfg = GPTDatasetConfig(
        random_seed=d.seed,
        sequence_length=cfg.model.seq_length,
        blend_per_split=[_blend(d.blend), _blend(d.valid_blend), None],
        path_to_cache=cache,
        tokenizer=tok,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,  # causal masking happens inside attention (4x-20x faster)
        mid_level_dataset_surplus=0.05,
    )
    sizes = [(t.steps if steps is None else steps) * t.global_batch_size, valid_samples, None]
    answer_loss = d.task_loss == "answers"
    # plain runs: megatron's own class (its name is part of the sample-index cache names)
    cls = _gpt_dataset_class(answer_loss) if d.bos or answer_loss else GPTDataset
    try:  # megatron's own failure to write there is a bare Exception (a traceback)
        os.makedirs(cache, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"data.cache_dir: {cache}: cannot be made a folder ({e.filename}: "
                          f"{e.strerror}); set data.cache_dir to a writable folder") from None
    regular_cache_files(cache)
    with no_pickle(cache):
        train, valid, _ = BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, gcfg).build()
    if answer_loss and (not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0):
        tokens, n = _first_answers(train, cfg)
        if not tokens:
            print(f"[lenext] warning: data.task_loss 'answers': the first {n} training samples "
                  "hold no answer token (a loss and gradient of 0); check data.blend's task share "
                  "and its answer masks", flush=True)
    if record:
        blends = {k: [{"prefix": os.path.abspath(b.prefix), "weight": b.weight} for b in v]
                  for k, v in (("blend", d.blend), ("valid_blend", d.valid_blend))}
        os.makedirs(cfg.run_dir, exist_ok=True)
        path = os.path.join(cfg.run_dir, "data_inputs.json")
        _warn_changed(path, "shards", tok.shards, "shards remade")
        _warn_changed(path, "answer_masks", masks, "answer masks changed")
        atomic_write(path, json.dumps({**blends, "task_loss": d.task_loss, "shards": tok.shards,
                                       "answer_masks": masks}, indent=2) + "\n")
    return train, (valid if d.valid_blend and valid_samples else None)


def _warn_changed(path: str, key: str, now: dict, what: str) -> None:
    """A resumed run whose shards or answer masks differ from the ones its data_inputs.json
    recorded under `key` reads other samples or loss tokens from here on: say which (the run goes
    on; the new record replaces the old)."""
    try:
        with open(path) as f:
            old = json.load(f).get(key) or {}
    except (OSError, ValueError, AttributeError):
        return
    changed = sorted(k for k in now.keys() & old.keys() if now[k] != old[k])
    if changed:
        print(f"[lenext] warning: {what} since {path} was written: {', '.join(changed)} (the steps "
              "from here on read other samples or loss tokens than the earlier ones)", flush=True)


def sample_indices(step: int, micro: int, rank: int, world: int, micro_batch: int,
                   global_batch: int) -> range:
    """Global sample indices of one micro-batch (see the module docstring)."""
    start = step * global_batch + (micro * world + rank) * micro_batch
    return range(start, start + micro_batch)


def collate(dataset, indices, document_mask: bool = False) -> dict[str, torch.Tensor]:
    """Stack samples into a micro-batch; `document_mask` adds `document_ids` [b, s] (from the
    dataset tokenizer's EOS, and BOS when data.bos put one before every document)."""
    samples = [dataset[i] for i in indices]
    batch = {k: torch.stack([s[k] for s in samples]) for k in ("tokens", "labels", "loss_mask",
                                                                "position_ids")}
    if document_mask:
        from lenext_dist.attention import document_ids

        tok = dataset.config.tokenizer
        batch["document_ids"] = document_ids(batch["tokens"], eos_id=tok.eod,
                                             bos_id=getattr(tok, "bos", None))
    return batch


class StepBatches(torch.utils.data.Dataset):
    """Item i: this rank's list of micro-batches of optimizer step `start_step` + i, up to the end
    of `span` (the steps [first, end) whose samples `dataset` holds: step t reads its samples
    [(t - first) G, (t - first + 1) G); default the whole run)."""

    def __init__(self, dataset, cfg: RunConfig, rank: int, world: int, start_step: int,
                 span: Optional[tuple[int, int]] = None):
        self.dataset, self.cfg, self.rank, self.world, self.start = dataset, cfg, rank, world, start_step
        self.first, self.end = span or (0, cfg.train.steps)

    def __len__(self) -> int:
        return max(0, self.end - self.start)

    def __getitem__(self, i: int) -> list[dict[str, torch.Tensor]]:
        t, step = self.cfg.train, self.start + i - self.first
        return [collate(self.dataset, sample_indices(step, m, self.rank, self.world, t.micro_batch_size,
                                                     t.global_batch_size), self.cfg.data.document_mask)
                for m in range(t.accum_steps(self.world))]


def loader_workers(cfg: RunConfig, device: str) -> int:
    """data.loader_workers, or its default for `device` (e.g. "cuda:0"): 1 on an accelerator, 0 on
    the CPU."""
    w = cfg.data.loader_workers
    return w if w is not None else int(not device.startswith("cpu"))


def train_batches(dataset, cfg: RunConfig, rank: int, world: int, start_step: int, workers: int = 0,
                  span: Optional[tuple[int, int]] = None) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Yield, per optimizer step from `start_step` to the end of `span` (StepBatches), this rank's
    list of micro-batches; `workers` > 0 builds them in that many processes ahead of the step that
    takes them (in order, two each)."""
    steps = StepBatches(dataset, cfg, rank, world, start_step, span)
    if not workers:
        return (steps[i] for i in range(len(steps)))
    return worker_batches(steps, workers)


def valid_batches(dataset, cfg: RunConfig, rank: int, world: int, eval_index: int
                  ) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's validation micro-batches for the `eval_index`-th evaluation (fresh samples):
    train.eval_iters global batches read as the training steps are, so that an evaluation reads
    the same samples whatever the number of ranks (a run resumed on more nodes logs a comparable
    validation loss)."""
    t = cfg.train
    accum = t.accum_steps(world)
    for i in range(t.eval_iters):
        for m in range(accum):
            idx = sample_indices(eval_index * t.eval_iters + i, m, rank, world, t.micro_batch_size,
                                 t.global_batch_size)
            yield collate(dataset, idx, cfg.data.document_mask)
