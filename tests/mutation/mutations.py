"""The mutation list: small, plausible bugs in the critical code, each of which the unit tier must
catch. `python tests/mutation/run.py` plants them one at a time (see the README, "Mutation pass").

One entry per bug: `M(name, area, file, original, replacement, tests)`.
- name: unique, short (`--only NAME` selects it);
- area: what it guards (the summary counts per area);
- file: the file to change, relative to the repository root;
- original: text that occurs EXACTLY ONCE in that file (the runner refuses an entry whose text is
  absent or repeated: after a refactor, update the entry);
- replacement: what the bug writes instead;
- tests: the unit test files (or node ids) that should catch it; the runner runs them with
  `-m "not distributed and not e2e" -x` (`--full` runs the whole unit tier instead).

Adding the mutations of new code: append entries below (or in a new list concatenated into
MUTATIONS), then run `python tests/mutation/run.py --only NAME` for each one until it is caught.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class M:
    name: str
    area: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]


T_ATT = "tests/unit/test_attention.py"
T_VAR = "tests/unit/test_variants.py"
T_HF = "tests/unit/test_hf_modeling.py"
T_PPL = "tests/unit/test_eval_ppl.py"
T_ENGINE = "tests/unit/test_train_engine.py"

MUTATIONS: list[M] = [
    # ---- attention variants (every registered one) and the core function -------------------
    M("nope-gets-rotated", "attention", "lenext_dist/attention/position.py",
      "        return q, k\n", "        return q * 1.01, k\n", (T_ATT, T_VAR)),
    M("rope-rotate-half-sign", "attention", "lenext_dist/attention/rope.py",
      "return torch.cat((-x2, x1), dim=-1)", "return torch.cat((x2, -x1), dim=-1)", (T_ATT,)),
    M("rope-base-exponent", "attention", "lenext_dist/attention/rope.py",
      "return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))",
      "return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / (dim + 2)))",
      (T_ATT,)),
    M("yarn-mscale-cos-only", "attention", "lenext_dist/attention/rope.py",
      "sin = (emb.sin() * self.mscale).to(dtype)", "sin = emb.sin().to(dtype)", (T_ATT,)),
    M("yarn-ramp-reversed", "attention", "lenext_dist/attention/rope.py",
      "extrapolate = 1.0 - ramp", "extrapolate = ramp", (T_ATT,)),
    M("pi-multiplies", "attention", "lenext_dist/attention/rope.py",
      "return _base_inv_freq(dim, base) / factor, 1.0", "return _base_inv_freq(dim, base) * factor, 1.0",
      (T_ATT,)),
    M("ntk-exponent", "attention", "lenext_dist/attention/rope.py",
      "base * factor ** (dim / (dim - 2))", "base * factor", (T_ATT,)),
    M("alibi-slope-sign", "attention", "lenext_dist/attention/alibi.py",
      'return -self.const("slopes", device)[:, None] * dist[None, :]',
      'return self.const("slopes", device)[:, None] * dist[None, :]', (T_VAR,)),
    M("alibi-slopes-non-power-of-2", "attention", "lenext_dist/attention/position.py",
      "alibi_slopes(2 * p)[0::2][: num_heads - p]", "alibi_slopes(2 * p)[1::2][: num_heads - p]", (T_VAR,)),
    M("kerple-log-no-log", "attention", "lenext_dist/attention/kerple.py",
      "torch.log1p(self.r2()[:, None] * dist[None, :])", "(self.r2()[:, None] * dist[None, :])", (T_VAR,)),
    M("sandwich-offset", "attention", "lenext_dist/attention/sandwich.py",
      "(dots - self.dim // 2)[None, :]", "(dots - self.dim)[None, :]", (T_VAR,)),
    M("xpos-key-decay-not-inverted", "attention", "lenext_dist/attention/xpos.py",
      "apply_rotary(k, (cos / up).to(k.dtype), (sin / up).to(k.dtype))",
      "apply_rotary(k, (cos * up).to(k.dtype), (sin * up).to(k.dtype))", (T_VAR,)),
    M("distance-bias-off-by-one", "attention", "lenext_dist/attention/position.py",
      "dist = (q_pos[..., :, None] - k_pos[..., None, :]).clamp(0, n - 1)",
      "dist = (q_pos[..., :, None] - k_pos[..., None, :] + 1).clamp(0, n - 1)", (T_VAR,)),
    M("window-off-by-one", "attention", "lenext_dist/attention/mask.py",
      "vis = vis & (q - k < self.window)", "vis = vis & (q - k <= self.window)", (T_VAR,)),
    M("log-scale-from-zero", "attention", "lenext_dist/attention/position.py",
      "torch.log(torch.clamp(i / self.train_length, min=1.0))",
      "torch.log(torch.clamp(i / self.train_length, min=0.5))", (T_VAR,)),
    M("eager-scale-sqrt", "attention", "lenext_dist/attention/core.py",
      "kf.transpose(-1, -2)) / math.sqrt(d)", "kf.transpose(-1, -2)) / d", (T_ATT,)),
    # ---- checkpoint <-> HF key map, export --------------------------------------------------
    M("keymap-norms-swapped", "key map", "lenext_dist/convert/keymap.py",
      '("model.layers.{i}.post_attention_layernorm.weight",)),',
      '("model.layers.{i}.input_layernorm.weight",)),', (T_HF,)),
    M("export-drops-learned-scales", "export", "lenext_dist/convert/export.py",
      "learned = HF_HEAD_SCALE.format(i=0) in hf_state", "learned = False",
      ("tests/unit/test_export_learned_scales.py",)),
    M("export-layer0-scales-everywhere", "export", "lenext_dist/convert/export.py",
      "scales = torch.stack([hf_state[HF_HEAD_SCALE.format(i=i)].float()",
      "scales = torch.stack([hf_state[HF_HEAD_SCALE.format(i=0)].float()",
      ("tests/unit/test_export_learned_scales.py",)),
    # ---- training: LR schedule, data order, resume, accumulation, HeadScale clamp, markers ------
    M("lr-warmup-off-by-one", "LR schedule", "lenext_dist/train/optim.py",
      "return opt.lr * (step + 1) / opt.warmup_steps", "return opt.lr * step / opt.warmup_steps",
      ("tests/unit/test_optim_schedule.py",)),
    M("lr-ignores-min-lr-ratio", "LR schedule", "lenext_dist/train/optim.py",
      "floor = opt.lr * opt.min_lr_ratio", "floor = 0.0", ("tests/unit/test_optim_schedule.py",)),
    M("lr-logged-for-next-step", "LR schedule", "lenext_dist/train/loop.py",
      "lr = optim.cosine_lr(step, cfg.optim, cfg.train.steps)",
      "lr = optim.cosine_lr(step + 1, cfg.optim, cfg.train.steps)", (T_ENGINE,)),
    M("data-offset-forgets-accumulation", "data order", "lenext_dist/data/gpt_data.py",
      "start = step * global_batch + (micro * world + rank) * micro_batch",
      "start = step * global_batch + (micro + rank) * micro_batch", ("tests/unit/test_data_order.py",)),
    M("data-step-stride-micro", "data order", "lenext_dist/data/gpt_data.py",
      "start = step * global_batch + (micro * world + rank) * micro_batch",
      "start = step * micro_batch * world + (micro * world + rank) * micro_batch",
      ("tests/unit/test_data_order.py",)),
    M("resume-replays-from-step-0", "resume", "lenext_dist/train/loop.py",
      "batches = train_batches(train_ds, cfg, rank, world, step)",
      "batches = train_batches(train_ds, cfg, rank, world, 0)", (T_ENGINE,)),
    M("resume-drops-rng", "resume", "lenext_dist/train/checkpoint.py",
      '    set_rng_state(client["rng"])\n', "", (T_ENGINE,)),
    M("loss-divided-by-accumulation-twice", "accumulation", "lenext_dist/train/loop.py",
      "engine.backward(loss)  #", "engine.backward(loss / len(micro_batches))  #", (T_ENGINE,)),
    M("clamp-skips-zero-master", "HeadScale clamp", "lenext_dist/train/optim.py",
      "            safe_set_full_fp32_param(p, master.clamp(min=min_value))\n",
      "            pass\n", (T_ENGINE,)),
    M("clamp-never-called", "HeadScale clamp", "lenext_dist/train/loop.py",
      "            optim.clamp_head_scales(engine.module, hs_cfg.min_value)\n", "            pass\n",
      (T_ENGINE,)),
    M("latest-before-complete", "checkpoint markers", "lenext_dist/train/checkpoint.py",
      '        _atomic_write(root / tag / COMPLETE, f"{step}\\n")\n        _atomic_write(root / LATEST, tag + "\\n")\n',
      '        _atomic_write(root / LATEST, tag + "\\n")\n        _atomic_write(root / tag / COMPLETE, f"{step}\\n")\n',
      (T_ENGINE, "tests/unit/test_checkpoint.py")),
    M("retire-keeps-complete", "checkpoint markers", "lenext_dist/train/checkpoint.py",
      "    (root / tag / COMPLETE).unlink(missing_ok=True)\n", "", ("tests/unit/test_checkpoint.py",)),
    # ---- evaluation protocols ---------------------------------------------------------------
    M("ppl-last-stride-scores-all", "PPL protocols", "lenext_dist/eval/ppl.py",
      "return [(a, W, W - S, W) for a in range(0, n - W, S)]",
      "return [(a, W, 0, W) for a in range(0, n - W, S)]", (T_PPL,)),
    M("ppl-full-overlapping", "PPL protocols", "lenext_dist/eval/ppl.py",
      "return [(a, W, 0, W) for a in range(0, n - W, W)]",
      "return [(a, W, 0, W) for a in range(0, n - W, max(1, W // 2))]", (T_PPL,)),
    M("ppl-yarn-protocol-rescores", "PPL protocols", "lenext_dist/eval/ppl.py",
      "out.append((a, end - a, prev_end - a, end - a))", "out.append((a, end - a, 0, end - a))", (T_PPL,)),
    M("context-gain-sign", "PPL protocols", "lenext_dist/eval/ppl.py",
      'out.update({"gain": float(a.mean() - b.mean())', 'out.update({"gain": float(b.mean() - a.mean())',
      (T_PPL,)),
    M("scale-sweep-scale-not-applied", "PPL protocols", "lenext_dist/eval/adapter.py",
      "a.scaling = float(c) / math.sqrt(a.head_dim)", "a.scaling = 1.0 / math.sqrt(a.head_dim)",
      ("tests/unit/test_eval_scale_sweep.py",)),
    M("passkey-one-token-short", "passkey", "lenext_dist/eval/passkey.py",
      "new = greedy_generate(model, ids, max_new_tokens).cpu().tolist()",
      "new = greedy_generate(model, ids, max_new_tokens - 1).cpu().tolist()",
      ("tests/unit/test_eval_passkey.py",)),
    M("passkey-depth-floored", "passkey", "lenext_dist/eval/passkey.py",
      "n1 = int(round(depth * n))", "n1 = int(depth * n)", ("tests/unit/test_eval_passkey.py",)),
    # ---- the study's gates ------------------------------------------------------------------
    M("study-context-gate-best-seed", "study gates", "lenext_dist/eval/claims.py",
      "return bool(ng) and min(ng) >= CTX_MIN_GAIN", "return bool(ng) and max(ng) >= CTX_MIN_GAIN",
      ("tests/unit/test_study_writeup.py",)),
    M("study-context-gate-strict", "study gates", "lenext_dist/eval/claims.py",
      "return bool(ng) and min(ng) >= CTX_MIN_GAIN", "return bool(ng) and min(ng) > CTX_MIN_GAIN",
      ("tests/unit/test_study_writeup.py",)),
    M("study-headscale-gain-gate", "study gates", "lenext_dist/eval/claims.py",
      "abs(rel) <= CLOSE and gain_T >= GAIN", "abs(rel) <= CLOSE and gain_T >= 0", ("tests/unit/test_study_writeup.py",)),
    M("study-close-gate", "study gates", "lenext_dist/eval/claims.py",
      'v = "agrees" if all(abs(x - 1) <= CLOSE for x in ratios)',
      'v = "agrees" if any(abs(x - 1) <= CLOSE for x in ratios)', ("tests/unit/test_study_writeup.py",)),
    # ---- data preparation -------------------------------------------------------------------
    M("token-dtype-uint16-always", "token dtype", "lenext_dist/prep/tokenizer.py",
      "return indexed_dataset().DType.optimal_dtype(vocab_size)", "return np.uint16", ("tests/unit/test_prep_tokenizer.py::test_token_dtype_follows_the_vocabulary_size",)),
]
