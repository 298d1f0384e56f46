"""Per-layer attention layouts: which position variant each layer of a model runs.

A layout is an entry of `LAYOUTS`: a function (num_layers, base, layout options) -> one registry
name (`registry.POSITIONS`) per layer and whether the layer is local (takes attention.window),
where `base` is the run's `attention.position`. Adding a layout is a function and one line here;
the model code only ever sees a list of variants.

    uniform     every layer `base` (every model before layouts; the default)
    nope_every  layers k, 2k, 3k, ... (1-based) NoPE, the others `base` (`every`: k); with base
                `rope`, the interleaved NoPE/RoPE of SmolLM3 (k = 4) and of the NoPE/RoPE hybrids
    smollm3     SmolLM3-3B's pattern: nope_every with k = 4 over RoPE (`base` must be `rope`;
                transformers' SmolLM3Config default `no_rope_layer_interval` 4)
    local_global layers k, 2k, ... global NoPE (full causal attention), the others `base` under
                the sliding window attention.window (needed): Cohere Command R7B / Command A's
                three local RoPE layers per global NoPE layer with k = 4 and base `rope`
    irope       Llama 4's iRoPE: layers k, 2k, ... global NoPE, the others `base` under chunked
                attention attention.chunked (needed: each query sees its own chunk of C tokens;
                transformers Llama4TextConfig `attention_chunk_size`, `no_rope_layer_interval` 4);
                with attention.temperature `llama4` on the NoPE layers as Llama 4 ships it
    explicit    `layers`: one registry name per layer, e.g. [rope, rope, rope, nope]; the layers
                `global_layers` lists (1-based) attend globally, the others take the window/chunk

A layout function returns (name, local) per layer; attention.window and attention.chunked apply to
the local layers (every layer, except the global ones of local_global and irope). Everything else
of `attention` applies to every layer (rope settings: RoPE layers rotate with attention.rope, its
PI/NTK/YaRN scaling and its rotary fraction, NoPE layers ignore it), except
attention.temperature, whose `layers` picks the layers it scales (temperature.py; by default the
NoPE ones), and attention.qk_norm, whose `layers` picks the layers it normalizes (qknorm.py: all,
or the RoPE ones as Llama 4).

`layer_variants(attn_cfg, num_layers=, head_dim=, train_length=, num_heads=)` builds the list:
one variant object per distinct (name, window, chunked), shared by the layers that run it (a RoPE cos/sin
table is then computed once per forward); a layer holding a variant with learned parameters takes its own
copy through `PositionVariant.for_layer()` (megatron's core attention and the HF model both do).

Layout options are read duck-typed from `attn_cfg.layout` (the `LayoutConfig` of
lenext_dist.config, or the plain dict of an exported config.json turned into attributes):
`kind`, `every`, `layers`, `global_layers`; a missing `layout` is `uniform` (exports made before layouts).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, NamedTuple, Optional

from .cfg import cfg_get
from .position import PositionVariant
from .registry import POSITIONS, build_position


Layer = tuple[str, bool]
"""(registry name, local): `local` layers take attention.window (when set), the others attend
to every earlier token."""


class Options(NamedTuple):
    """The `attention.layout` options a layout function reads."""

    every: int
    layers: list
    global_layers: list


def _uniform(n: int, base: str, o: Options) -> list[Layer]:
    return [(base, True)] * n


def _every(n: int, every: int) -> list[bool]:
    """True for layers k, 2k, ... (1-based)."""
    if every < 1:
        raise ValueError(f"attention.layout.every must be >= 1, got {every}")
    return [(i + 1) % every == 0 for i in range(n)]


def _nope_every(n: int, base: str, o: Options) -> list[Layer]:
    return [("nope" if kth else base, True) for kth in _every(n, o.every)]


def _smollm3(n: int, base: str, o: Options) -> list[Layer]:
    if base != "rope":
        raise ValueError(f"attention.layout 'smollm3' interleaves NoPE with RoPE: it needs "
                         f"attention.position 'rope', got {base!r} (nope_every takes any base)")
    return _nope_every(n, base, o)  # k = every: SmolLM3's no_rope_layer_interval (4 in SmolLM3-3B)


def _local_global(n: int, base: str, o: Options) -> list[Layer]:
    return [("nope", False) if kth else (base, True) for kth in _every(n, o.every)]


def _irope(n: int, base: str, o: Options) -> list[Layer]:
    if base != "rope":
        raise ValueError(f"attention.layout 'irope' interleaves NoPE with chunked RoPE: it needs "
                         f"attention.position 'rope', got {base!r}")
    return _local_global(n, base, o)


def _explicit(n: int, base: str, o: Options) -> list[Layer]:
    if len(o.layers) != n:
        raise ValueError(f"attention.layout.layers has {len(o.layers)} entries for {n} layers "
                         "(model.num_layers): give one position name per layer")
    outside = sorted(set(o.global_layers) - set(range(1, n + 1)))
    if outside:
        raise ValueError(f"attention.layout.global_layers {outside} are not layers 1..{n}")
    return [(x, i + 1 not in o.global_layers) for i, x in enumerate(o.layers)]


LAYOUTS: dict[str, Callable[[int, str, Options], list[Layer]]] = {
    "uniform": _uniform,
    "nope_every": _nope_every,
    "smollm3": _smollm3,
    "local_global": _local_global,
    "irope": _irope,
    "explicit": _explicit,
}
NEEDS = {"local_global": "window", "irope": "chunked"}
"""Layouts whose point is local attention -> the attention key they are refused without."""
DEFAULT_EVERY = 4
"""`every` when the layout section does not give it (SmolLM3's interval)."""


def layout_kind(attn_cfg) -> str:
    return cfg_get(attn_cfg, "layout", "kind", default="uniform")


Spec = tuple[str, Optional[int], Optional[int]]
"""(registry name, window, chunked) of one layer."""


def layer_specs(attn_cfg, num_layers: int) -> list[Spec]:
    """(registry name, window, chunked) of each of `num_layers` layers: attention.window and
    attention.chunked on the layout's local layers, None on its global ones (ValueError naming the
    key when the layout is unknown, malformed, or names a variant that is not registered)."""
    kind = layout_kind(attn_cfg)
    if kind not in LAYOUTS:
        raise ValueError(f"unknown attention.layout.kind {kind!r}; registered: {sorted(LAYOUTS)}")
    o = Options(int(cfg_get(attn_cfg, "layout", "every", default=DEFAULT_EVERY)),
                list(cfg_get(attn_cfg, "layout", "layers", default=[])),
                [int(i) for i in cfg_get(attn_cfg, "layout", "global_layers", default=[])])
    for key in ("layers", "global_layers"):
        if getattr(o, key) and kind != "explicit":
            raise ValueError(f"attention.layout.{key} is read by kind 'explicit' only, not {kind!r}")
    window, chunked = cfg_get(attn_cfg, "window"), cfg_get(attn_cfg, "chunked")
    if kind in NEEDS and cfg_get(attn_cfg, NEEDS[kind]) is None:
        raise ValueError(f"attention.layout {kind!r} needs attention.{NEEDS[kind]} (the "
                         "attention span of its local layers)")
    specs = [(x, window, chunked) if local else (x, None, None)
             for x, local in LAYOUTS[kind](num_layers, attn_cfg.position, o)]
    unknown = sorted({x for x, *_ in specs if x not in POSITIONS})
    if unknown:
        raise ValueError(f"attention.layout names unknown variants {unknown}; registered: "
                         f"{sorted(POSITIONS)}")
    return specs


def layer_names(attn_cfg, num_layers: int) -> list[str]:
    """The registry name of each of `num_layers` layers (see `layer_specs`)."""
    return [x for x, *_ in layer_specs(attn_cfg, num_layers)]


def layer_windows(attn_cfg, num_layers: int) -> list[Optional[int]]:
    """The sliding window of each layer (None: full causal attention; see `layer_specs`)."""
    return [w for _, w, _ in layer_specs(attn_cfg, num_layers)]


def layer_chunks(attn_cfg, num_layers: int) -> list[Optional[int]]:
    """The attention chunk of each layer (None: not chunked; see `layer_specs`)."""
    return [c for *_, c in layer_specs(attn_cfg, num_layers)]


def labels(specs: list[Spec]) -> list[str]:
    """One label per layer: its name, '+ window W' / '+ chunked C' added where the layers
    differ in them."""
    if len({(w, c) for _, w, c in specs}) <= 1:
        return [x for x, *_ in specs]
    return [x + (f" + window {w}" if w is not None else "") + (f" + chunked {c}" if c is not None
            else "") for x, w, c in specs]


def is_uniform(names: list[str]) -> bool:
    return len(set(names)) <= 1


def describe(names: list[str]) -> str:
    """Per-layer names as a short run-length string: [rope, rope, rope, nope] -> 'rope x3, nope'."""
    out, i = [], 0
    while i < len(names):
        j = i
        while j < len(names) and names[j] == names[i]:
            j += 1
        out.append(names[i] + (f" x{j - i}" if j - i > 1 else ""))
        i = j
    return ", ".join(out)


def refusal(specs: list[Spec], scaling: str = "none", fraction: float = 1.0) -> Optional[str]:
    """Why these layers (`layer_specs`) cannot run with attention.rope.scaling `scaling` and
    attention.rope.fraction `fraction`, or None."""
    names = [x for x, *_ in specs]
    rotary = any(POSITIONS[x].rope_scalings for x in names)
    if scaling != "none" and not rotary:
        return (f"attention.rope.scaling {scaling!r} scales a RoPE rotation; no layer "
                f"({describe(names)}) has one (use rope.scaling 'none')")
    if fraction != 1.0 and not rotary:
        return (f"attention.rope.fraction {fraction} rotates part of each head with RoPE; no layer "
                f"({describe(names)}) runs RoPE (use rope.fraction 1.0)")
    learned = sorted({x for x in names if POSITIONS[x].learned})
    if learned and len(set(specs)) > 1:
        return (f"attention.layout: learned variants {learned} in a non-uniform layout are not "
                "supported yet (use attention.layout.kind 'uniform')")
    return None


def summary(attn_cfg, num_layers: int) -> str:
    """' (layout nope_every: rope, nope, rope, nope)' ('' for a uniform layout), then QK-norm and
    a partial rotation when set: ', qk_norm l2 on rope layers, rope fraction 0.25' (log lines)."""
    kind = layout_kind(attn_cfg)
    out = "" if kind == "uniform" else \
        f" (layout {kind}: {describe(labels(layer_specs(attn_cfg, num_layers)))})"
    qk_kind = cfg_get(attn_cfg, "qk_norm", "kind", default="none")  # qknorm.py's section
    eps = cfg_get(attn_cfg, "qk_norm", "eps")
    qk = "" if qk_kind == "none" else (
        f"qk_norm {qk_kind}{'' if eps is None else f' (eps {eps:g})'} on "
        f"{cfg_get(attn_cfg, 'qk_norm', 'layers', default='all')} layers")
    fraction = float(cfg_get(attn_cfg, "rope", "fraction", default=1.0))
    extra = [x for x in (qk, f"rope fraction {fraction:g}" if fraction != 1.0 else "") if x]
    return out + "".join(f", {x}" for x in extra)


class _LayerView:
    """`attn_cfg` as one layer's variant sees it: `position`, `window`, `chunked` the layer's,
    and `rope.scaling` 'none' for a variant without a rotation (a NoPE layer of a RoPE+YaRN model
    has nothing to scale; `build_position` refuses a scaling it would ignore)."""

    def __init__(self, cfg, position: str, rope, window: Optional[int], chunked: Optional[int]):
        self._cfg, self.position, self.rope = cfg, position, rope
        self.window, self.chunked = window, chunked

    def __getattr__(self, name):
        if name == "_cfg":  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self._cfg, name)


def layer_variants(attn_cfg, *, num_layers: int, head_dim: int, train_length: int,
                   num_heads: Optional[int] = None) -> list[PositionVariant]:
    """One variant per layer, as `build_position` builds it for the layer's registry name: one
    object per distinct name, shared by its layers (each layer calls `for_layer()` on it)."""
    specs = layer_specs(attn_cfg, num_layers)
    if set(specs) == {(attn_cfg.position, cfg_get(attn_cfg, "window"),
                       cfg_get(attn_cfg, "chunked"))}:  # the pre-layout build
        v = build_position(attn_cfg, head_dim=head_dim, train_length=train_length,
                           num_heads=num_heads)
        return [v] * num_layers
    why = refusal(specs, cfg_get(attn_cfg, "rope", "scaling", default="none"),
                  float(cfg_get(attn_cfg, "rope", "fraction", default=1.0)))
    if why:
        raise ValueError(why)
    rope = getattr(attn_cfg, "rope", None)
    plain = SimpleNamespace(base=cfg_get(rope, "base", default=10000.0), scaling="none",
                            factor=1.0)
    built: dict[tuple, PositionVariant] = {}
    for x, w, c in dict.fromkeys(specs):
        view = _LayerView(attn_cfg, x, rope if POSITIONS[x].rope_scalings else plain, w, c)
        built[x, w, c] = build_position(view, head_dim=head_dim, train_length=train_length,
                                        num_heads=num_heads)
    return [built[spec] for spec in specs]
