"""Models on the Hugging Face Hub: `hf://org/repo[@revision]/path/model.onnx` or
`("hf", "org/repo", "path/model.onnx")`.

Files are fetched with huggingface_hub (optional: `pip install transmuter[hub]`), so its cache
(`HF_HOME`, `HF_HUB_CACHE`), `HF_ENDPOINT`, `HF_HUB_OFFLINE`, token and progress bars apply. The
external-data files a model names are fetched into the same snapshot folder, at the commit the
model file came from, before the model is parsed.

Each file emits `transmuter.hub.info` (a span around finding its commit; stop adds `result`:
"fetched" when the Hub answered, "saved" when the cache's record was used), then either
`transmuter.hub.hit` (measurements `count`, `bytes`) or the span `transmuter.hub.download` (stop
adds `bytes`). A hit says how the cached copy was trusted (`check`):
- "etag":    a HEAD round-trip named the current commit and ETag, and the cache holds that file;
- "hash":    the revision is a commit hash (given, or the model's commit for its external data),
             whose files never change: no round-trip;
- "none":    the endpoint answered without `X-Repo-Commit` / `ETag` (a plain web server, or a proxy
             that drops them), so nothing could be checked; the cached copy is used, with a warning;
- "offline": `HF_HUB_OFFLINE` is set, or the Hub could not be reached (connection failure, timeout,
             HTTP 5xx / 408 / 429), and the cached copy is used (with a warning when unreachable).
"""

from __future__ import annotations

import posixpath
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote, unquote

import onnx
from google.protobuf.message import DecodeError

from transmuter import telemetry
from transmuter.errors import ModelLoadError, TransmuterError

PREFIX = "hf://"
DEFAULT_REVISION = "main"
_COMMIT = re.compile(r"[0-9a-f]{40}")
# Hub refs that contain '/', written as they are in hf:// URIs (the Hub's own grammar); other
# revisions are percent-encoded there (a '/' as %2F).
_SLASHED_REF = re.compile(r"refs/(?:pr/\d+|convert/[\w.-]+)")
_OTHER_REPO_TYPES = ("datasets/", "spaces/", "buckets/", "kernels/")
# Statuses that mean "the Hub could not answer now", not "the answer is no".
_UNAVAILABLE = {408, 429, 500, 502, 503, 504}


@dataclass(frozen=True)
class HubFile:
    """A file in a Hugging Face Hub model repository; `revision` None means the default branch."""

    repo: str
    path: str
    revision: str | None = None

    @property
    def uri(self) -> str:
        """hf://org/repo[@revision]/path, which `hub_file` reads back."""
        if self.revision is None:
            at = ""
        elif _SLASHED_REF.fullmatch(self.revision):
            at = "@" + self.revision
        else:
            at = "@" + quote(self.revision, safe="")
        return f"{PREFIX}{self.repo}{at}/{self.path}"


def hub_file(source: Any, revision: str | None = None) -> HubFile | None:
    """The Hub file `source` names (`hf://...` or `("hf", repo, path)`), or None for any other
    source, with which `revision` may not be given."""
    if isinstance(source, tuple) and len(source) == 3 and source[0] == "hf":
        _, repo, path = source
        if not isinstance(repo, str) or not isinstance(path, str):
            raise ModelLoadError(
                f"a Hub source is ('hf', repo, path) with two strings, not {source!r}"
            )
        return _checked(HubFile(repo, path, revision), repr(source))
    if isinstance(source, str) and source.startswith(PREFIX):
        return _parse_uri(source, revision)
    if revision is not None:
        raise TransmuterError(
            f"revision={revision!r} applies to Hugging Face Hub sources only "
            "('hf://org/repo/file.onnx' or ('hf', repo, file)); drop it for a local model"
        )
    return None


def _parse_uri(uri: str, revision: str | None) -> HubFile:
    rest = uri[len(PREFIX) :]
    if rest.startswith(_OTHER_REPO_TYPES):
        raise ModelLoadError(
            f"{uri!r} names a {rest.split('/')[0]} repository; models load from model repos"
        )
    rest = rest.removeprefix("models/")
    parts = rest.split("/", 2)
    if len(parts) < 3 or not parts[0] or not parts[1]:
        raise ModelLoadError(
            f"{uri!r} is not a Hub file: write hf://org/repo/path/model.onnx "
            "(or hf://org/repo@revision/path/model.onnx)"
        )
    namespace, name, path = parts
    named = None
    if "@" in name:
        name, _, named = name.partition("@")
        after = named + "/" + path
        slashed = _SLASHED_REF.match(after)
        if slashed and after[slashed.end() :].startswith("/"):  # @refs/pr/1/model.onnx
            named, path = slashed.group(), after[slashed.end() + 1 :]
        else:
            named = unquote(named)
        if not named:
            raise ModelLoadError(f"{uri!r} has an empty revision after '@'")
    if named is not None and revision is not None:
        raise ModelLoadError(
            f"{uri!r} names revision {named!r} and revision={revision!r} was given too: "
            "give the revision once"
        )
    return _checked(HubFile(f"{namespace}/{name}", path, revision or named), repr(uri))


def _checked(file: HubFile, what: str) -> HubFile:
    parts = file.path.split("/")
    if not file.path or file.path.startswith("/") or "" in parts or ".." in parts:
        raise ModelLoadError(
            f"{what}: {file.path!r} is not a file path inside the repository "
            "(relative, '/'-separated, no empty or '..' parts)"
        )
    if file.revision is not None and not file.revision:
        raise ModelLoadError(f"{what}: the revision is empty; give a branch, tag or commit hash")
    return file


def fetch(file: HubFile) -> Path:
    """Fetch a model file and its external-data files into one snapshot folder of the Hugging
    Face cache (or find them there); return the model file's path in that folder."""
    hf = _huggingface_hub()
    try:
        model = _fetch_one(hf, file.repo, file.path, file.revision or DEFAULT_REVISION)
        fetched = [model]
        for path in _external_data_paths(model.path, file.path):
            fetched.append(_fetch_one(hf, file.repo, path, model.commit))
    except hf.utils.HFValidationError as exc:
        raise ModelLoadError(f"{file.uri!r}: {exc}") from None
    for note in (f.note for f in fetched if f.note):
        warnings.warn(note, stacklevel=3)  # fetch <- transmuter.load <- the caller
    return model.path


class _Missing(ModelLoadError):
    """The repository has no such file at that revision (or, offline, the cache has none)."""


def fetch_present(repo: str, paths: list[str], revision: str | None = None) -> dict[str, Path]:
    """Those of `paths` the repository has, fetched (with their external data) at one commit:
    the commit `revision` names when the first of them is found. What a folder-level reader
    (`transmuter.load_repo`) asks for, probing the file names the Hub's layouts use."""
    found: dict[str, Path] = {}
    commit = None
    for path in paths:
        file = _checked(HubFile(repo, path, commit or revision), repr(path))
        try:
            local = fetch(file)
        except _Missing:
            continue
        found[path] = local
        commit = commit or _commit_of(local, path)
    return found


def resolve(source: Any, revision: str | None = None) -> Path:
    """The local path of a Hub source (`hf://...` or `("hf", repo, path)`), fetched with its
    external data: what `transmuter.load` reads, for tools that read the file themselves."""
    file = hub_file(source, revision)
    if file is None:
        raise ModelLoadError(f"{source!r} is not a Hugging Face Hub source (hf://org/repo/path)")
    return fetch(file)


def _huggingface_hub():
    try:
        import huggingface_hub
        import huggingface_hub.file_download
        import huggingface_hub.utils
    except ImportError:
        raise ModelLoadError(
            "loading from the Hugging Face Hub needs huggingface_hub, which is not installed: "
            "pip install transmuter[hub]"
        ) from None
    return huggingface_hub


@dataclass
class _Fetched:
    path: Path
    commit: str
    note: str | None = None  # a warning for the caller: served from the cache unchecked


@dataclass
class _Resolved:
    """Where a file stands before anything is downloaded."""

    commit: str
    cached: Path | None  # the cached copy to serve as is, if any
    check: str  # how the cached copy is trusted (see the module docstring)
    etag: str | None = None  # the Hub's ETag, when it answered
    note: str | None = None


def _fetch_one(hf, repo: str, path: str, revision: str) -> _Fetched:
    """One file: find its commit (info span), then serve it from the cache (hit) or download it."""
    metadata = {"source": ("hf", repo, path), "revision": revision}
    with telemetry.span("transmuter.hub.info", metadata) as info:
        resolved = _resolve(hf, repo, path, revision)
        info.stop_metadata.update(
            result="fetched" if resolved.etag is not None else "saved", commit=resolved.commit
        )
    metadata = {**metadata, "commit": resolved.commit}
    if resolved.cached is not None:
        _hit(resolved.cached, resolved.check, metadata)
        return _Fetched(resolved.cached, resolved.commit, resolved.note)
    if _in_cache(hf, repo, path, resolved.commit, resolved.etag):
        # The content is cached under another ref or commit: huggingface_hub links it into this
        # snapshot and records the ref, without downloading.
        local = _download(hf, repo, path, revision)
        _hit(local, resolved.check, metadata)
        return _Fetched(local, _commit_of(local, path))
    with telemetry.span("transmuter.hub.download", metadata) as download:
        local = _download(hf, repo, path, revision)
        download.stop_metadata["bytes"] = local.stat().st_size
    return _Fetched(local, _commit_of(local, path))


def _where(repo: str, path: str, revision: str) -> str:
    return f"{path!r} from Hugging Face Hub repository {repo!r} at revision {revision!r}"


def _resolve(hf, repo: str, path: str, revision: str) -> _Resolved:
    where = _where(repo, path, revision)
    cache = hf.constants.HF_HUB_CACHE
    if hf.constants.HF_HUB_OFFLINE:
        cached = _cached(hf, repo, path, revision)
        if cached is None:
            raise _Missing(
                f"HF_HUB_OFFLINE is set and {where} is not in the cache ({cache}): unset "
                "HF_HUB_OFFLINE to download it, or fetch it once while online"
            )
        return _Resolved(_commit_of(cached, path), cached, "offline")
    if _COMMIT.fullmatch(revision):
        cached = _cached(hf, repo, path, revision)
        if cached is not None:
            return _Resolved(revision, cached, "hash")
    url = hf.hf_hub_url(repo, path, revision=revision)
    try:
        remote = hf.get_hf_file_metadata(url)
    except hf.utils.GatedRepoError:
        raise ModelLoadError(
            f"Hugging Face Hub repository {repo!r} is gated: request access on its page, then log "
            "in (`hf auth login`) or set HF_TOKEN"
        ) from None
    except hf.utils.RepositoryNotFoundError:
        raise ModelLoadError(
            f"Hugging Face Hub repository {repo!r} does not exist or is private: check the name; "
            "for a private repository log in (`hf auth login`) or set HF_TOKEN"
        ) from None
    except hf.utils.RevisionNotFoundError:
        raise ModelLoadError(
            f"revision {revision!r} does not exist in Hugging Face Hub repository {repo!r}: give "
            "a branch, a tag or a 40-character commit hash of that repository"
        ) from None
    except hf.utils.EntryNotFoundError:
        raise _Missing(
            f"{path!r} does not exist in Hugging Face Hub repository {repo!r} at revision "
            f"{revision!r}: check the path, relative to the repository's root"
        ) from None
    except hf.utils.HfHubHTTPError as exc:
        if exc.response is None or exc.response.status_code not in _UNAVAILABLE:
            raise ModelLoadError(f"the Hugging Face Hub refused {where}: {exc}") from None
        return _fall_back(hf, repo, path, revision, "offline", f"the Hub is unavailable ({exc})")
    except _no_answer_errors() as exc:
        reason = f"cannot reach the Hub at {hf.constants.ENDPOINT} ({type(exc).__name__}: {exc})"
        return _fall_back(hf, repo, path, revision, "offline", reason)
    if remote.commit_hash is None or remote.etag is None:
        reason = f"{url} answered without a Hub's X-Repo-Commit and ETag (is HF_ENDPOINT right?)"
        return _fall_back(hf, repo, path, revision, "none", reason)
    cached = _cached(hf, repo, path, revision)
    if cached is not None and _commit_of(cached, path) != remote.commit_hash:
        cached = None  # the cached copy is of an older commit
    return _Resolved(remote.commit_hash, cached, "etag", remote.etag)


def _fall_back(hf, repo: str, path: str, revision: str, check: str, reason: str) -> _Resolved:
    where = _where(repo, path, revision)
    cached = _cached(hf, repo, path, revision)
    if cached is None:
        raise ModelLoadError(
            f"{reason}, and {where} is not in the cache ({hf.constants.HF_HUB_CACHE}): check the "
            "connection and HF_ENDPOINT, or fetch it once while online"
        )
    commit = _commit_of(cached, path)
    note = f"{reason}; loading {where} from the cache (commit {commit}), which may be out of date"
    return _Resolved(commit, cached, check, note=note)


def _cached(hf, repo: str, path: str, revision: str) -> Path | None:
    """The cached copy of a file at a revision (a branch or tag as last seen), or None."""
    found = hf.try_to_load_from_cache(repo, path, revision=revision)
    return Path(found) if isinstance(found, str) else None  # not cached, or cached as missing


def _in_cache(hf, repo: str, path: str, commit: str, etag: str | None) -> bool:
    """Whether the cache holds this content already: at the commit, or as the blob of its ETag
    (huggingface_hub's cache layout: <repo folder>/blobs/<etag>)."""
    if _cached(hf, repo, path, commit) is not None:
        return True
    folder = hf.file_download.repo_folder_name(repo_id=repo, repo_type="model")
    return (
        etag is not None and (Path(hf.constants.HF_HUB_CACHE) / folder / "blobs" / etag).is_file()
    )


def _download(hf, repo: str, path: str, revision: str) -> Path:
    try:
        return Path(hf.hf_hub_download(repo, path, revision=revision))
    except _no_answer_errors() as exc:  # HfHubHTTPError is an OSError too
        raise ModelLoadError(
            f"downloading {path!r} from Hugging Face Hub repository {repo!r} at revision "
            f"{revision!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def _no_answer_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean no answer came back from the Hub: huggingface_hub raises its HTTP
    client's own (requests' are OSErrors, before huggingface_hub 1.0; httpx's and then httpx2's
    TransportError after), and OSError covers sockets and huggingface_hub's offline mode."""
    clients = (sys.modules.get(name) for name in ("httpx2", "httpx"))
    return (OSError, *(client.TransportError for client in clients if client is not None))


def _commit_of(local: Path, path: str) -> str:
    """The commit of a cached file: its snapshot folder, <repo>/snapshots/<commit>/<path>."""
    return local.parents[len(PurePosixPath(path).parts) - 1].name


def _hit(local: Path, check: str, metadata: dict) -> None:
    if telemetry.listening("transmuter.hub.hit"):
        measurements = {"count": 1, "bytes": local.stat().st_size}
        telemetry.emit("transmuter.hub.hit", measurements, {**metadata, "check": check})


def _external_data_paths(model: Path, model_path: str) -> list[str]:
    """The repository paths of the external-data files a model names, read from its protobuf
    without loading them. A location outside the model's folder is refused here, before any
    download, as the loader would refuse it. A file that does not parse names none: the loader
    reports it."""
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(model.read_bytes())
    except (DecodeError, RuntimeError, ValueError):
        return []
    folder = posixpath.dirname(model_path)
    paths: dict[str, None] = {}  # ordered and unique
    for tensor in _tensors(proto):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        inside = posixpath.normpath(location)
        if not location or posixpath.isabs(inside) or inside == ".." or inside.startswith("../"):
            raise ModelLoadError(
                f"{model_path!r}: tensor {tensor.name!r} keeps its data in {location!r}, which is "
                "not a file inside the model's folder; refusing to fetch it"
            )
        paths[posixpath.join(folder, inside)] = None
    return list(paths)


def _tensors(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from _graph_tensors(proto.graph)
    for function in proto.functions:
        for node in function.node:
            yield from _node_tensors(node)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    for a in node.attribute:
        if a.HasField("t"):
            yield a.t
        yield from a.tensors
        one = [a.sparse_tensor] if a.HasField("sparse_tensor") else []
        for sparse in [*one, *a.sparse_tensors]:
            yield from (sparse.values, sparse.indices)
        if a.HasField("g"):
            yield from _graph_tensors(a.g)
        for g in a.graphs:
            yield from _graph_tensors(g)
