"""Inputs for a model made from its specs: dims named in the file, sizes the caller gives, the
inputs given, and the model's Hugging Face config when there is one."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from transmuter import ir
from transmuter.errors import TransmuterError
from transmuter.runtime.model import Model

# The sizes made-up inputs get where neither the file, the caller's dims, the given inputs nor
# the config fix them. Small, so that a sweep over many models is cheap, but not 1 where 1 could
# hide broadcasting mistakes (batch 1 is what serving uses, so it stays).
DEFAULT_SIZES: Mapping[str, int] = MappingProxyType(
    {
        "batch": 1,
        "sequence": 8,
        "past": 0,  # an empty past (the first step of generation): "total" lengths = "sequence"
        "encoder_sequence": 16,  # encoder states handed to a decoder
        "image_size": 224,  # height and width when the config names no image_size
        "channels": 3,
        "mel_bins": 80,  # audio features per frame when the config names no num_mel_bins
        "audio_frames": 3000,  # 30 s of 10 ms frames: what Whisper-style encoders take
        "audio_samples": 16000,  # 1 s at 16 kHz for raw-waveform encoders (wav2vec2-style)
        "vocab": 16,  # token ids stay below it when neither config nor graph gives the vocabulary
    }
)
# The lengths that roles share: what a dim named for one of them (or a role) sets for the rest.
_LENGTHS = ("batch", "sequence", "past", "encoder_sequence")
# What a dim's name says it counts, by the first word found in it.
_DIM_WORDS = (
    ("batch", "batch"),
    ("past", "past"),
    ("total", "total"),
    ("encoder", "encoder_sequence"),
    ("height", "height"),
    ("width", "width"),
    ("channel", "channels"),
    ("seq", "sequence"),
)
# Ops that carry token ids unchanged on their way to the embedding table, and the table reads.
_PASS_THROUGH = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Cast", "Identity"})
_EMBEDDING_OPS = frozenset({"Gather", "GatherBlockQuantized"})
# Nested config sections where model sizes live for composite models (CLIP, Whisper, LLaVA...).
_CONFIG_SECTIONS = ("text_config", "vision_config", "audio_config", "encoder", "decoder")
# Inputs whose role fixes their sizes go first, so that dim names they share bind to those sizes;
# masks follow the past, so that they span past + new tokens.
_ORDER = {"past": 1, "mask": 2, "encoder_mask": 2, "other": 3}


def example_inputs(
    model: Model | ir.Model,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
    given: Mapping[str, Any] | None = None,
    config: Mapping | None = None,
) -> dict:
    """Inputs for every input of `model` (a `transmuter.Model`, or only its `ir.Model`, which
    is enough for a model Transmuter cannot run): the `given` ones as they are, the others made
    up from their declared types, their names (the names Hugging Face exporters use) and, if
    given, the model's config.json contents.

    A named dim takes its size from `dims`, else from an input already made or given that
    declares it, else from the input's role, else from what its name says (`batch*`, `past*`,
    `total*` = past + sequence, `encoder*`, height/width/channels, sums such as
    `past_sequence_length + 1`); the sizes are `DEFAULT_SIZES` unless the config names them.
    Values: token ids below the vocabulary size (the config's vocab_size, or the rows of the
    embedding table the ids index), attention masks of ones spanning past + new tokens, position
    ids counting from the past length, token type ids zeros, pixel values of the configured
    image size, num_mel_bins x 3000 audio features, an empty past with use_cache_branch false,
    other floats standard normal, other integers zeros, booleans true."""
    graph = model.graph if isinstance(model, ir.Model) else model.ir.graph
    specs = {v.name: v.type for v in graph.inputs}
    rng = np.random.default_rng(seed)
    given = dict(given or {})
    sizes = _Sizes(config, dims or {})
    for name, value in given.items():
        spec = specs.get(name)
        if isinstance(spec, ir.TensorType) and spec.shape is not None:
            sizes.observe(name, spec.shape, np.shape(value))
    made = {}
    wanted = [name for name in specs if name not in given]
    for name in sorted(wanted, key=lambda n: _ORDER.get(_kind(n), 0)):
        spec = specs[name]
        if not isinstance(spec, ir.TensorType) or spec.shape is None:
            raise TransmuterError(
                f"input {name!r} is {spec or 'undeclared'}: give it explicitly (--input)"
            )
        shape = sizes.shape(name, spec.shape)
        made[name] = sizes.values(graph, name, shape, np.dtype(spec.dtype), rng)
    return {name: given[name] if name in given else made[name] for name in specs}


def _kind(name: str) -> str:
    """What an input is, from its name (the names Hugging Face exporters use)."""
    n = name.lower()
    if n == "use_cache_branch":
        return "use_cache_branch"
    if "past" in n or n.startswith("cache.") or ".cache." in n:
        return "past"
    if "encoder_attention_mask" in n:
        return "encoder_mask"
    if "mask" in n:
        return "mask"
    if "position_ids" in n or n == "cache_position":
        return "positions"
    if "token_type_ids" in n or "segment" in n:
        return "token_types"
    if n.endswith("input_ids") or n == "ids" or n.endswith("_ids"):
        return "tokens"
    if n in ("pixel_values", "images", "image"):
        return "pixels"
    if n == "input_features":
        return "features"
    if n == "input_values":
        return "waveform"
    if "encoder_hidden_states" in n or n == "encoder_outputs":
        return "encoder_states"
    return "other"


def _meaning(name: str) -> str | None:
    lowered = name.lower()
    return next((meaning for word, meaning in _DIM_WORDS if word in lowered), None)


def _said(dim: ir.SymbolicDim, owner: str, axis: int) -> str:
    """The dim's name as the file gives it; "" for the fresh name the loader gives an unnamed
    dim (`<input>_dim<axis>`), which says nothing about what the dim counts."""
    return "" if dim.name == f"{owner}_dim{axis}" else dim.name


class _Sizes:
    """Decides the size of every open dim. A dim name binds once, so that inputs sharing it
    agree; the lengths roles depend on (batch, sequence, past, encoder sequence) follow what was
    bound, so a mask spans the past and the tokens actually made, whatever its dim is called."""

    def __init__(self, config: Mapping | None, dims: Mapping[str, int]):
        self.config = config
        self.bound: dict[str, int] = {}
        self.length = {name: DEFAULT_SIZES[name] for name in _LENGTHS}
        for name, size in dims.items():
            self.bind(name, name, size)

    def bind(self, key: str, said: str, size: int) -> None:
        if key in self.bound:
            return
        self.bound[key] = size
        meaning = _meaning(said) if "+" not in said else None
        if meaning in self.length:
            self.length[meaning] = size

    def observe(self, name: str, declared, shape) -> None:
        """Bind the named dims of an input of `shape` (made or given)."""
        for axis, (dim, size) in enumerate(zip(declared, shape)):
            if isinstance(dim, ir.SymbolicDim):
                self.bind(dim.name, _said(dim, name, axis), int(size))
        if _kind(name) in ("tokens", "positions", "token_types") and len(shape):
            self.length["sequence"] = int(shape[-1])

    def shape(self, name: str, declared) -> tuple[int, ...]:
        kind = _kind(name)
        shape = []
        for axis, dim in enumerate(declared):
            size = dim if isinstance(dim, int) else self.bound.get(dim.name)
            if size is None:
                size = self.role(kind, len(declared), axis)
            if size is None and kind == "past" and axis == len(declared) - 1:
                size = self.head_size(dim.name)
            if size is None:
                size = self.by_name(_said(dim, name, axis), axis, kind)
            shape.append(size)
        self.observe(name, declared, shape)
        return tuple(shape)

    def role(self, kind: str, rank: int, axis: int) -> int | None:
        """The size an input's role asks for on `axis`, or None when the role says nothing."""
        last = axis == rank - 1
        if axis == 0 and rank > 1:
            return self.length["batch"]
        if kind == "mask":
            return self.length["past"] + self.length["sequence"] if last else None
        if kind in ("tokens", "positions", "token_types") and last:
            return self.length["sequence"]
        if (kind == "encoder_mask" and last) or (kind == "encoder_states" and axis == 1):
            return self.length["encoder_sequence"]
        if kind == "pixels" and rank == 4:
            height, width = _image_size(self.config)
            return {1: self.channels(), 2: height, 3: width}[axis]
        if kind == "features" and rank == 3:
            if axis == 1:
                return _config_value(self.config, "num_mel_bins") or DEFAULT_SIZES["mel_bins"]
            positions = _config_value(self.config, "max_source_positions")
            return 2 * positions if positions else DEFAULT_SIZES["audio_frames"]
        if kind == "waveform" and last:
            return DEFAULT_SIZES["audio_samples"]
        if kind == "use_cache_branch":
            return 1
        return None

    def head_size(self, dim: str) -> int:
        """A cache's last dim: the attention head size, from the config or `dims` only (a
        guess would only make the reference fail further on)."""
        size = _config_value(self.config, "head_dim")
        hidden = _config_value(self.config, "hidden_size")
        heads = _config_value(self.config, "num_attention_heads")
        if size is None and hidden and heads:
            size = hidden // heads
        if size is None:
            raise TransmuterError(
                f"the cache dim {dim!r} is the attention head size, which the model's inputs do "
                f"not say: give it (--dim {dim}=SIZE) or the model's config (--config)"
            )
        self.bound[dim] = size
        return size

    def by_name(self, said: str, axis: int, kind: str) -> int:
        """The size a dim's name asks for; a name that says nothing gets the batch on axis 0,
        the past length in a past, else the sequence length."""
        if "+" in said:  # e.g. "past_sequence_length + 1" in Optimum exports
            return sum(self.term(t.strip(), axis, kind) for t in said.split("+"))
        meaning = _meaning(said)
        if meaning in self.length:
            return self.length[meaning]
        if meaning == "total":
            return self.length["past"] + self.length["sequence"]
        if meaning in ("height", "width"):
            return _image_size(self.config)[meaning == "width"]
        if meaning == "channels":
            return self.channels()
        if axis == 0:
            return self.length["batch"]
        return self.length["past" if kind == "past" else "sequence"]

    def term(self, text: str, axis: int, kind: str) -> int:
        if text.isdigit():
            return int(text)
        return self.bound.get(text, self.by_name(text, axis, kind))

    def channels(self) -> int:
        return _config_value(self.config, "num_channels") or DEFAULT_SIZES["channels"]

    def values(self, graph, name: str, shape: tuple[int, ...], dtype: np.dtype, rng) -> np.ndarray:
        kind = _kind(name)
        past = self.length["past"]
        if kind == "use_cache_branch":
            return np.full(shape, past > 0, dtype)
        if kind in ("mask", "encoder_mask"):
            return np.ones(shape, dtype)
        if kind == "positions" and shape:
            return np.broadcast_to(np.arange(past, past + shape[-1]), shape).astype(dtype)
        if kind == "tokens" and dtype.kind in "iu":
            return rng.integers(0, _vocabulary(graph, name, self.config), shape).astype(dtype)
        if dtype.kind == "f" or dtype.kind == "V":  # "V": bfloat16 and friends
            scale = 0.1 if kind == "waveform" else 1.0
            return (scale * rng.standard_normal(shape)).astype(dtype)
        if dtype == np.bool_:
            return np.ones(shape, bool)
        if dtype.kind in "iu":
            return np.zeros(shape, dtype)  # token type ids and other integer inputs
        raise TransmuterError(f"cannot make example values of type {dtype}: give input {name!r}")


def _config_value(config: Mapping | None, key: str) -> Any:
    """`key` from a Hugging Face config, or from its nested sections (text_config, ...)."""
    if not config:
        return None
    if config.get(key) is not None:
        return config[key]
    for section in _CONFIG_SECTIONS:
        if isinstance(config.get(section), Mapping) and config[section].get(key) is not None:
            return config[section][key]
    return None


def _image_size(config: Mapping | None) -> tuple[int, int]:
    size = _config_value(config, "image_size")
    if isinstance(size, int):
        return size, size
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[0]), int(size[1])
    if isinstance(size, Mapping) and "height" in size and "width" in size:
        return int(size["height"]), int(size["width"])
    return DEFAULT_SIZES["image_size"], DEFAULT_SIZES["image_size"]


def _vocabulary(graph: ir.Graph, name: str, config: Mapping | None) -> int:
    """How many distinct token ids input `name` may hold: the smallest of the config's
    vocab_size and the rows of the embedding tables the ids index."""
    known = [_config_value(config, "vocab_size"), *embedding_rows(graph, name)]
    return min([int(v) for v in known if v] or [DEFAULT_SIZES["vocab"]])


def embedding_rows(graph: ir.Graph, input_name: str) -> list[int]:
    """The row counts of the tables that `input_name` (token ids) indexes, as far as the graph
    shows them: the ids pass through reshapes and casts, then a Gather reads an initializer."""
    carried = {input_name}
    rows = []
    for node in graph.nodes:
        if node.op_type in _PASS_THROUGH and node.inputs and node.inputs[0] in carried:
            carried.update(node.outputs)
        elif node.op_type in _EMBEDDING_OPS and len(node.inputs) > 1 and node.inputs[1] in carried:
            table = graph.initializers.get(node.inputs[0])
            if table is not None and table.ndim:
                rows.append(int(table.shape[0]))
    return rows
