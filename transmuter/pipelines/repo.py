"""`load_repo`: a Hugging Face model repository (a local folder or `hf://org/repo[@revision]`)
as its configs, its tokenizer and the ONNX files of the layouts the Hub uses.

Optimum writes `model.onnx` (encoders, and decoders with past key values), or
`encoder_model.onnx` and `decoder_model.onnx` / `decoder_with_past_model.onnx` /
`decoder_model_merged.onnx`; transformers.js writes the same names under `onnx/`, with a suffix
per weight type (`model_fp16.onnx`, `model_quantized.onnx`, `model_q4.onnx`,
`model_q4f16.onnx`), which `dtype=` chooses.
Tokenizers need `pip install transmuter[pipelines]`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.frontend import hub

CONFIGS = (
    "config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "tokenizer_config.json",
    # sentence-transformers: the modules after the model (pooling, normalization).
    "modules.json",
    "1_Pooling/config.json",
)
TOKENIZER = "tokenizer.json"
# The ONNX files by role, as Optimum names them.
ROLES = {
    "model": "model",
    "encoder": "encoder_model",
    "decoder": "decoder_model",
    "decoder_with_past": "decoder_with_past_model",
    "decoder_merged": "decoder_model_merged",
    # Models exported in parts (transformers.js and onnx-community): CLIP's two towers, SAM's
    # image encoder and prompt decoder, Florence-2's vision encoder and token embeddings.
    "text_model": "text_model",
    "vision_model": "vision_model",
    "vision_encoder": "vision_encoder",
    "prompt_encoder_mask_decoder": "prompt_encoder_mask_decoder",
    "embed_tokens": "embed_tokens",
}
# Model types whose position ids start past the padding id (RobertaEmbeddings' padding_idx),
# so that max_position_embeddings counts positions no token can take.
POSITION_OFFSET_TYPES = frozenset(
    {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text", "longformer",
     "mpnet", "ibert", "luke", "markuplm"}
)  # fmt: skip
# transformers.js's dtype names and the suffix of their files.
DTYPES = {"fp32": "", "fp16": "_fp16", "q8": "_quantized", "q4": "_q4", "q4f16": "_q4f16"}
FOLDERS = ("", "onnx/")


@dataclass
class Repo:
    """A model repository's files. `config`, `generation_config`, `preprocessor_config` and
    `tokenizer_config` are the JSON files ({} where absent); `modules` and `pooling` are
    sentence-transformers' modules.json ([] where absent) and 1_Pooling/config.json; `onnx` maps a role (a key of ROLES) to its local file; `tokenizer` is a
    `tokenizers.Tokenizer` or None."""

    source: str
    config: dict[str, Any]
    generation_config: dict[str, Any]
    preprocessor_config: dict[str, Any]
    onnx: dict[str, Path]
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    modules: list[Any] = field(default_factory=list)
    pooling: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None
    found: list[str] = field(default_factory=list)  # every file found, for error messages
    # By role and the outputs loaded at one position only (`model`'s options).
    _models: dict[tuple, transmuter.Model] = field(default_factory=dict, repr=False)
    _load_options: dict[str, Any] = field(default_factory=dict, repr=False)

    def shard(self, mesh: Any, model_axis: str | None = None) -> None:
        """Load this repository's models with their params on `mesh`, split over `model_axis`
        (`transmuter.load`'s options): the tasks then run on its devices, XLA's partitioner
        adding the collectives. Placement happens as a model is read, so before any is."""
        if self._models:
            raise InputError(
                f"{self.source}: {sorted({key[0] for key in self._models})} already loaded on "
                "one device; shard the repo before a pipeline loads its models"
            )
        self._load_options = {"mesh": mesh, "model_axis": model_axis}

    def model(
        self,
        role: str,
        *,
        last_position: tuple[str, ...] = (),
        at_position: tuple[tuple[str, str], ...] = (),
    ) -> transmuter.Model:
        """The ONNX file of `role`, loaded once for each `last_position` and `at_position`
        (`transmuter.load`'s: outputs computed at one position only; (output, input) pairs)."""
        if role not in self.onnx:
            raise ModelLoadError(
                f"{self.source} has no {ROLES.get(role, role)}.onnx; found {self.found}"
            )
        key = (role, last_position, at_position)
        if key not in self._models:
            self._models[key] = transmuter.load(
                self.onnx[role],
                last_position=last_position,
                at_position=dict(at_position),
                **self._load_options,
            )
        return self._models[key]

    def require_tokenizer(self, task: str) -> Any:
        """A copy of the repository's tokenizer for one task: a task sets its own truncation
        (a window length, a template's room), which another task on the same repo must not
        see."""
        if self.tokenizer is None:
            raise ModelLoadError(
                f"{task} needs {TOKENIZER}, and {self.source} has none; found {self.found}"
            )
        return type(self.tokenizer).from_str(self.tokenizer.to_str())

    def max_length(self) -> int | None:
        """The most tokens the model reads, as transformers' tokenizers cut: the tokenizer's
        `model_max_length` where set, within the position table less the positions that
        RoBERTa-style models keep for padding (their position ids start at pad_token_id + 1:
        514 positions read 512 tokens). None where neither file says."""
        positions = self.config.get("max_position_embeddings")
        if isinstance(positions, int) and self.config.get("model_type") in POSITION_OFFSET_TYPES:
            positions -= int(self.config.get("pad_token_id") or 0) + 1
        given = self.tokenizer_config.get("model_max_length")
        # transformers writes a huge sentinel (int(1e30)) where a tokenizer sets no limit.
        given = given if isinstance(given, int) and given < 1_000_000 else None
        limits = [n for n in (positions, given) if isinstance(n, int) and n > 0]
        return min(limits) if limits else None


def load_repo(source: str | os.PathLike, *, dtype: str | None = None) -> Repo:
    """Read a repository: a local folder, or `hf://org/repo[@revision]` fetched through
    huggingface_hub's cache (files at one commit, external data included). `dtype` picks
    transformers.js's weight files under `onnx/` ("fp32", "fp16", "q8", "q4", "q4f16"); by
    default Optimum's files at the top, else `onnx/model.onnx` and its siblings."""
    if dtype is not None and dtype not in DTYPES:
        raise ModelLoadError(f"dtype must be one of {', '.join(DTYPES)} or None; got {dtype!r}")
    wanted = _candidates(dtype)
    if isinstance(source, str) and source.startswith(hub.PREFIX):
        name = source
        repo, revision = _hub_repo(source)
        local = hub.fetch_present(repo, [*CONFIGS, TOKENIZER, *wanted], revision)
    else:
        name = os.fspath(source)
        folder = Path(source).expanduser()
        if not folder.is_dir():
            raise ModelLoadError(f"{name!r} is not a folder (or an hf://org/repo source)")
        local = {path: folder / path for path in [*CONFIGS, TOKENIZER, *wanted]}
        local = {path: file for path, file in local.items() if file.is_file()}
        # Every ONNX file where the layouts keep them, so an error shows what dtypes there are.
        others = [*folder.glob("*.onnx"), *folder.glob("onnx/*.onnx")]
        found = sorted({*local, *(p.relative_to(folder).as_posix() for p in others)})
    if isinstance(source, str) and source.startswith(hub.PREFIX):
        found = sorted(local)
    onnx = _layout(local, wanted)
    if not onnx:
        raise ModelLoadError(
            f"{name} has no ONNX model in Optimum's or transformers.js's layout"
            f"{'' if dtype is None else f' for dtype={dtype!r}'} (looked for "
            f"{', '.join(wanted)}); found {found}{_dtype_hint(found, dtype)}"
        )
    return Repo(
        source=name,
        config=json_file(local.get("config.json")),
        generation_config=json_file(local.get("generation_config.json")),
        preprocessor_config=json_file(local.get("preprocessor_config.json")),
        onnx=onnx,
        tokenizer_config=json_file(local.get("tokenizer_config.json")),
        modules=json_file(local.get("modules.json"), list),
        pooling=json_file(local.get("1_Pooling/config.json")),
        tokenizer=_tokenizer(local.get(TOKENIZER)),
        found=found,
    )


def _dtype_hint(found: list[str], dtype: str | None) -> str:
    """What to pass when the files under onnx/ are of other dtypes than the one asked for (a
    repo of only model_quantized.onnx, read without dtype=)."""
    held = [
        name
        for name, suffix in DTYPES.items()
        if name != dtype and any(f"onnx/{stem}{suffix}.onnx" in found for stem in ROLES.values())
    ]
    if not held:
        return ""
    return f"; it holds {' and '.join(held)} files: pass dtype={held[0]!r}" + (
        f" (or {', '.join(repr(d) for d in held[1:])})" if len(held) > 1 else ""
    )


def _candidates(dtype: str | None) -> dict[str, tuple[str, str]]:
    """Each file to look for: repository path -> (folder, role), in order of preference."""
    if dtype is None:
        places = [("", ""), ("onnx/", "")]
    else:
        places = [("onnx/", DTYPES[dtype])]
    return {
        f"{folder}{stem}{suffix}.onnx": (folder, role)
        for folder, suffix in places
        for role, stem in ROLES.items()
    }


def _layout(local: Mapping[str, Path], wanted: dict[str, tuple[str, str]]) -> dict[str, Path]:
    """The ONNX files of the first folder that holds any, by role."""
    for folder in FOLDERS:
        roles = {
            role: local[path]
            for path, (place, role) in wanted.items()
            if place == folder and path in local
        }
        if roles:
            return roles
    return {}


def _hub_repo(source: str) -> tuple[str, str | None]:
    """hf://org/repo[@revision] as (repo, revision), with the revision grammar of files."""
    rest = source[len(hub.PREFIX) :].rstrip("/")
    if rest.count("/") != 1 or "" in rest.split("/"):
        raise ModelLoadError(
            f"{source!r} is not a Hub repository: write hf://org/repo or hf://org/repo@revision"
        )
    file = hub.hub_file(f"{hub.PREFIX}{rest}/config.json")
    return file.repo, file.revision


def json_file(path: Path | None, kind: type = dict) -> Any:
    """The JSON file at `path` holding a `kind` (an object; modules.json holds a list)."""
    if path is None:
        return kind()
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not a JSON file ({exc})") from None
    if not isinstance(value, kind):
        raise ModelLoadError(
            f"{path}: expected a JSON {'object' if kind is dict else 'array'}, "
            f"not {type(value).__name__}"
        )
    return value


def _tokenizer(path: Path | None) -> Any:
    if path is None:
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ModelLoadError(
            f"reading {TOKENIZER} needs the tokenizers library: pip install transmuter[pipelines]"
        ) from None
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception for a bad file
        raise ModelLoadError(f"{path}: not a tokenizer file ({exc})") from None
    # A file may fix a padding (sentence-transformers' all-MiniLM-L6-v2 pads every text to 128
    # tokens): the tasks pad batches themselves, with masks, and take each encoding's ids as
    # the text's real tokens.
    tokenizer.no_padding()
    return tokenizer


def read_json(repo: Repo, path: str) -> dict[str, Any]:
    """A JSON object of the repository that `load_repo` does not read (Florence-2's
    processor_config.json), from its folder or the Hub; {} where absent."""
    if repo.source.startswith(hub.PREFIX):
        name, revision = _hub_repo(repo.source)
        local = hub.fetch_present(name, [path], revision).get(path)
    else:
        local = Path(repo.source, path)
    return json_file(local if local is not None and local.is_file() else None)
