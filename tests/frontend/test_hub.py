"""Loading from the Hugging Face Hub, against a real HTTP server on loopback that answers as the
Hub does for what huggingface_hub asks (read from huggingface_hub's file_download.py and
utils/_http.py):

- HEAD / GET {endpoint}/{repo}/resolve/{revision}/{path}: 200 with `ETag` (the git blob sha1),
  `X-Repo-Commit` and `Content-Length` for a regular file; for a large (LFS) file, 302 to a CDN
  on another origin with `X-Linked-Etag` (its sha256), `X-Linked-Size` and `X-Repo-Commit`;
- errors as the Hub sends them: 401 `X-Error-Code: RepoNotFound` for an unknown repository, 404
  `RevisionNotFound` for an unknown revision, 404 `EntryNotFound` (with `X-Repo-Commit`) for an
  unknown file.

huggingface_hub reads HF_ENDPOINT, HF_HOME, HF_HUB_CACHE and HF_HUB_OFFLINE once, when imported,
into `huggingface_hub.constants` (and, in older versions such as 0.24, copies some into
`huggingface_hub.file_download`); the `hub` fixture sets the variables and patches those
constants where they are, so every test has its own endpoint and an empty cache in tmp_path.
Passes with huggingface_hub 0.24.7 and 2.4.0.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import onnx
import pytest
from huggingface_hub import constants, file_download
from onnx import TensorProto, helper, numpy_helper

import transmuter
from transmuter import telemetry
from transmuter.frontend.hub import HubFile, fetch, hub_file, resolve

REPO = "org/tiny"


# --- models --------------------------------------------------------------------------------------


def add_model(weights: np.ndarray) -> onnx.ModelProto:
    """Y = X + W, W float32[n] an initializer."""
    n = weights.size
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "W"], ["Y"])],
        "add",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [n])],
        [numpy_helper.from_array(weights.astype(np.float32), "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def with_external_data(model: onnx.ModelProto, folder: Path, location: str) -> dict[str, bytes]:
    """The files of `model` saved with its weights in `location` (beside it), by path."""
    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        folder / "model.onnx",
        save_as_external_data=True,
        location=location,
        size_threshold=0,
    )
    return {
        "model.onnx": (folder / "model.onnx").read_bytes(),
        location: (folder / location).read_bytes(),
    }


def commit_id(label: str) -> str:
    return hashlib.sha1(label.encode()).hexdigest()


# --- the Hub on loopback -------------------------------------------------------------------------


class FakeHub:
    """Model repositories served as the Hub serves them. `repos[repo]` maps branch -> commit and
    commit -> {path: bytes}; files whose path ends in "_data" are LFS files, served through the
    CDN server. `bare` makes /resolve answer 200 without the Hub's version headers; `status`
    makes it answer that status (a Hub outage). `requests` records (method, path)."""

    def __init__(self):
        self.branches: dict[str, dict[str, str]] = {}
        self.commits: dict[str, dict[str, dict[str, bytes]]] = {}
        self.requests: list[tuple[str, str]] = []
        self.bare = False
        self.status: int | None = None
        self.hub = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(self._resolve))
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(self._cdn))
        self.endpoint = f"http://127.0.0.1:{self.hub.server_port}"
        for server in (self.hub, self.cdn):
            threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()

    def publish(self, repo: str, files: dict[str, bytes], branch: str = "main") -> str:
        """A new commit on `branch` holding `files` (and the branch's earlier files)."""
        commits = self.commits.setdefault(repo, {})
        branches = self.branches.setdefault(repo, {})
        previous = commits.get(branches.get(branch, ""), {})
        commit = commit_id(f"{repo}:{branch}:{len(commits)}")
        commits[commit] = {**previous, **files}
        branches[branch] = commit
        return commit

    def stop(self) -> None:
        """Take both servers down (their ports then refuse connections); again does nothing."""
        for server in (self.hub, self.cdn):
            if server.socket.fileno() != -1:
                server.shutdown()
                server.server_close()

    def _handler(self, answer):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self):
                hub.requests.append(("HEAD", self.path))
                self._send(*answer(self.path), body=False)

            def do_GET(self):
                hub.requests.append(("GET", self.path))
                self._send(*answer(self.path), body=True)

            def _send(self, status, headers, content, body):
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                if body:
                    self.wfile.write(content)

            def log_message(self, *args):
                pass

        return Handler

    def _resolve(self, url: str):
        parts = url.lstrip("/").split("/", 4)
        if self.status is not None:
            return self.status, {}, b"Service Unavailable"
        if len(parts) < 5 or parts[2] != "resolve":
            return 404, {}, b"Not Found"
        repo, revision, path = f"{parts[0]}/{parts[1]}", unquote(parts[3]), unquote(parts[4])
        if repo not in self.commits:
            return (
                401,
                {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
                b"",
            )
        commit = self.branches[repo].get(revision, revision)
        if commit not in self.commits[repo]:
            error = {
                "X-Error-Code": "RevisionNotFound",
                "X-Error-Message": f"Invalid rev id: {revision}",
            }
            return 404, error, b""
        content = self.commits[repo][commit].get(path)
        if content is None:
            error = {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"}
            return 404, {**error, "X-Repo-Commit": commit}, b""
        if self.bare:
            return 200, {}, content
        if path.endswith("_data"):  # LFS: the Hub redirects to the CDN, naming the blob's sha256
            sha256 = hashlib.sha256(content).hexdigest()
            headers = {
                "Location": f"http://127.0.0.1:{self.cdn.server_port}/{sha256}",
                "X-Repo-Commit": commit,
                "X-Linked-Etag": f'"{sha256}"',
                "X-Linked-Size": str(len(content)),
                "ETag": f'"{commit_id(sha256)}"',  # the LFS pointer's own git sha1
            }
            return 302, headers, b""
        git_sha1 = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
        return 200, {"X-Repo-Commit": commit, "ETag": f'"{git_sha1}"'}, content

    def _cdn(self, url: str):
        wanted = url.lstrip("/")
        for files in (f for commits in self.commits.values() for f in commits.values()):
            for content in files.values():
                if hashlib.sha256(content).hexdigest() == wanted:
                    return 200, {}, content
        return 404, {}, b""


@pytest.fixture
def hub(tmp_path, monkeypatch):
    server = FakeHub()
    home = tmp_path / "hf_home"
    for name, value in {"HF_ENDPOINT": server.endpoint, "HF_HOME": str(home)}.items():
        monkeypatch.setenv(name, value)
    for name in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    set_constants(
        monkeypatch,
        ENDPOINT=server.endpoint,
        HUGGINGFACE_CO_URL_TEMPLATE=server.endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        HF_HOME=str(home),
        HF_HUB_CACHE=str(home / "hub"),
        HF_HUB_OFFLINE=False,
        HF_TOKEN_PATH=str(home / "token"),
        HF_STORED_TOKENS_PATH=str(home / "stored_tokens"),
    )
    yield server
    server.stop()


def set_constants(monkeypatch, **values):
    """Patch huggingface_hub's constants, and the copies older versions keep in file_download."""
    for name, value in values.items():
        for module in (constants, file_download):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, value)


def go_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    set_constants(monkeypatch, HF_HUB_OFFLINE=True)


@pytest.fixture
def events():
    seen: list[tuple[str, dict, dict]] = []
    names = [
        "transmuter.hub.hit",
        "transmuter.hub.info.start",
        "transmuter.hub.info.stop",
        "transmuter.hub.info.exception",
        "transmuter.hub.download.start",
        "transmuter.hub.download.stop",
        "transmuter.load.start",
    ]
    telemetry.attach("test_hub", names, lambda e, m, md: seen.append((e, m, md)))
    yield seen
    telemetry.detach("test_hub")


def kinds(events) -> list[str]:
    return [e.removeprefix("transmuter.") for e, _, _ in events if e.startswith("transmuter.hub.")]


def hit(events) -> tuple[dict, dict]:
    (found,) = [(m, md) for e, m, md in events if e == "transmuter.hub.hit"]
    return found


WEIGHTS = np.arange(4, dtype=np.float32)


def run(model, n=4) -> np.ndarray:
    return np.asarray(transmuter.run(model, {"X": np.ones(n, np.float32)})["Y"])


# --- the cases -----------------------------------------------------------------------------------


def test_first_load_downloads_then_the_cache_hits_after_an_etag_check(hub, events):
    model_bytes = add_model(WEIGHTS).SerializeToString()
    commit = hub.publish(REPO, {"onnx/model.onnx": model_bytes})

    model = transmuter.load(f"hf://{REPO}/onnx/model.onnx")
    np.testing.assert_array_equal(run(model), WEIGHTS + 1)
    assert kinds(events) == [
        "hub.info.start",
        "hub.info.stop",
        "hub.download.start",
        "hub.download.stop",
    ]
    stop = events[-1][2]
    source = ("hf", REPO, "onnx/model.onnx")
    assert stop == {
        "source": source,
        "revision": "main",
        "commit": commit,
        "bytes": len(model_bytes),
    }
    assert events[0][2]["source"] == f"hf://{REPO}/onnx/model.onnx"  # transmuter.load's source
    assert model.source == f"hf://{REPO}/onnx/model.onnx"

    events.clear()
    hub.requests.clear()
    transmuter.load(("hf", REPO, "onnx/model.onnx"))
    assert kinds(events) == ["hub.info.start", "hub.info.stop", "hub.hit"]
    assert events[2][2]["result"] == "fetched"
    measurements, metadata = hit(events)
    assert measurements == {"count": 1, "bytes": len(model_bytes)}
    assert metadata == {"source": source, "revision": "main", "commit": commit, "check": "etag"}
    assert hub.requests == [("HEAD", f"/{REPO}/resolve/main/onnx/model.onnx")]


def test_a_new_commit_with_a_new_etag_downloads_again(hub, events):
    hub.publish(REPO, {"model.onnx": add_model(WEIGHTS).SerializeToString()})
    transmuter.load(f"hf://{REPO}/model.onnx")
    new_commit = hub.publish(REPO, {"model.onnx": add_model(WEIGHTS * 10).SerializeToString()})
    events.clear()

    model = transmuter.load(f"hf://{REPO}/model.onnx")
    np.testing.assert_array_equal(run(model), WEIGHTS * 10 + 1)
    assert "hub.download.stop" in kinds(events) and "hub.hit" not in kinds(events)
    assert events[-1][2]["commit"] == new_commit


def test_a_new_commit_that_keeps_the_file_is_a_hit_without_a_download(hub, events):
    model_bytes = add_model(WEIGHTS).SerializeToString()
    hub.publish(REPO, {"model.onnx": model_bytes})
    transmuter.load(f"hf://{REPO}/model.onnx")
    new_commit = hub.publish(REPO, {"README.md": b"docs"})
    events.clear()
    hub.requests.clear()

    path = fetch(HubFile(REPO, "model.onnx"))
    assert path.parent.name == new_commit  # linked into the new snapshot by huggingface_hub
    assert hit(events)[1]["check"] == "etag" and "hub.download.start" not in kinds(events)
    assert not [r for r in hub.requests if r[0] == "GET"]


def test_a_commit_hash_revision_is_served_from_the_cache_without_a_request(hub, events):
    first = hub.publish(REPO, {"model.onnx": add_model(WEIGHTS).SerializeToString()})
    hub.publish(REPO, {"model.onnx": add_model(WEIGHTS * 10).SerializeToString()})
    model = transmuter.load(f"hf://{REPO}@{first}/model.onnx")  # cold: downloads that commit
    np.testing.assert_array_equal(run(model), WEIGHTS + 1)
    events.clear()
    hub.requests.clear()

    transmuter.load(f"hf://{REPO}/model.onnx", revision=first)
    assert hub.requests == []
    assert hit(events)[1]["check"] == "hash"
    assert [md["result"] for e, _, md in events if e == "transmuter.hub.info.stop"] == ["saved"]


def test_hf_hub_offline_serves_a_warm_cache_without_requests(hub, events, monkeypatch, recwarn):
    commit = hub.publish(REPO, {"model.onnx": add_model(WEIGHTS).SerializeToString()})
    transmuter.load(f"hf://{REPO}/model.onnx")
    go_offline(monkeypatch)
    events.clear()
    hub.requests.clear()

    model = transmuter.load(f"hf://{REPO}/model.onnx")
    np.testing.assert_array_equal(run(model), WEIGHTS + 1)
    assert hub.requests == []
    assert hit(events)[1] == {
        "source": ("hf", REPO, "model.onnx"),
        "revision": "main",
        "commit": commit,
        "check": "offline",
    }
    assert not [w for w in recwarn if "Hub" in str(w.message)]  # offline was asked for: no warning


def test_hf_hub_offline_with_a_cold_cache_says_what_to_do(hub, monkeypatch):
    hub.publish(REPO, {"model.onnx": add_model(WEIGHTS).SerializeToString()})
    go_offline(monkeypatch)
    with pytest.raises(transmuter.ModelLoadError, match="HF_HUB_OFFLINE is set") as error:
        transmuter.load(f"hf://{REPO}/model.onnx", revision="v1")
    assert all(
        s in str(error.value) for s in (REPO, "'model.onnx'", "'v1'", "unset HF_HUB_OFFLINE")
    )
    assert hub.requests == []


@pytest.mark.parametrize("outage", ["server down", "HTTP 503"])
def test_an_unreachable_hub_serves_a_warm_cache_with_a_warning(hub, events, outage):
    hub.publish(REPO, {"model.onnx": add_model(WEIGHTS).SerializeToString()})
    transmuter.load(f"hf://{REPO}/model.onnx")
    if outage == "server down":
        hub.stop()
    else:
        hub.status = 503
    events.clear()

    with pytest.warns(UserWarning, match="from the cache .* which may be out of date"):
        model = transmuter.load(f"hf://{REPO}/model.onnx")
    np.testing.assert_array_equal(run(model), WEIGHTS + 1)
    assert hit(events)[1]["check"] == "offline"


def test_an_unreachable_hub_with_a_cold_cache_is_a_clear_error(hub, events):
    hub.stop()
    with pytest.raises(transmuter.ModelLoadError, match="cannot reach the Hub") as error:
        transmuter.load(f"hf://{REPO}/model.onnx", revision="v2")
    assert all(s in str(error.value) for s in (REPO, "'model.onnx'", "'v2'", "not in the cache"))
    assert kinds(events) == ["hub.info.start", "hub.info.exception"]


def test_an_endpoint_without_hub_headers_serves_the_cache_unchecked(hub, events):
    model_bytes = add_model(WEIGHTS).SerializeToString()
    hub.publish(REPO, {"model.onnx": model_bytes, "other.onnx": model_bytes})
    transmuter.load(f"hf://{REPO}/model.onnx")
    hub.bare = True
    events.clear()
    with pytest.warns(UserWarning, match="without a Hub's X-Repo-Commit and ETag"):
        transmuter.load(f"hf://{REPO}/model.onnx")
    assert hit(events)[1]["check"] == "none"

    with pytest.raises(transmuter.ModelLoadError, match="is HF_ENDPOINT right"):
        transmuter.load(f"hf://{REPO}/other.onnx")


@pytest.mark.parametrize(
    "source, revision, message",
    [
        (("hf", "org/missing", "model.onnx"), None, "repository 'org/missing' does not exist"),
        (
            ("hf", REPO, "missing.onnx"),
            None,
            "'missing.onnx' does not exist in .* 'org/tiny' at revision 'main'",
        ),
        (("hf", REPO, "model.onnx"), "v9", "revision 'v9' does not exist in .* 'org/tiny'"),
    ],
    ids=["repo", "file", "revision"],
)
def test_unknown_repo_file_or_revision(hub, source, revision, message):
    hub.publish(REPO, {"model.onnx": add_model(WEIGHTS).SerializeToString()})
    with pytest.raises(transmuter.ModelLoadError, match=message):
        transmuter.load(source, revision=revision)


def test_external_data_is_fetched_into_the_same_snapshot_folder(hub, events, tmp_path):
    weights = np.arange(100, dtype=np.float32)
    files = with_external_data(add_model(weights), tmp_path / "export", "weights/model.onnx_data")
    commit = hub.publish(REPO, {f"onnx/{name}": content for name, content in files.items()})

    path = resolve(f"hf://{REPO}/onnx/model.onnx")
    assert path.parent.parent.name == commit
    assert (path.parent / "weights" / "model.onnx_data").read_bytes() == files[
        "weights/model.onnx_data"
    ]
    data = [md for e, _, md in events if e == "transmuter.hub.download.stop"][1]
    # the data file is fetched at the model's commit; its Hub answer was the CDN redirect
    assert data["source"] == ("hf", REPO, "onnx/weights/model.onnx_data")
    assert data["revision"] == commit
    assert (
        "GET",
        "/" + hashlib.sha256(files["weights/model.onnx_data"]).hexdigest(),
    ) in hub.requests

    events.clear()
    fetch(HubFile(REPO, "onnx/model.onnx"))
    assert [md["check"] for e, _, md in events if e == "transmuter.hub.hit"] == ["etag", "hash"]


def test_a_model_with_external_data_loads_and_runs(hub, tmp_path):
    weights = np.arange(100, dtype=np.float32)
    files = with_external_data(add_model(weights), tmp_path / "export", "model.onnx_data")
    hub.publish(REPO, files)
    model = transmuter.load(f"hf://{REPO}/model.onnx")
    np.testing.assert_array_equal(run(model, 100), weights + 1)


def test_external_data_outside_the_model_folder_is_refused_before_fetching(hub, tmp_path):
    files = with_external_data(add_model(WEIGHTS), tmp_path / "export", "model.onnx_data")
    proto = onnx.load_model_from_string(files["model.onnx"])
    proto.graph.initializer[0].external_data[0].value = "../secrets.bin"
    hub.publish(REPO, {"onnx/model.onnx": proto.SerializeToString()})
    with pytest.raises(
        transmuter.ModelLoadError,
        match="'../secrets.bin', which is not a file inside the model.s folder",
    ):
        transmuter.load(f"hf://{REPO}/onnx/model.onnx")
    assert not [r for r in hub.requests if "secrets" in r[1]]


# --- sources, without a server -------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, revision, expected",
    [
        ("hf://org/repo/model.onnx", None, HubFile("org/repo", "model.onnx")),
        ("hf://models/org/repo/a/b.onnx", "v1", HubFile("org/repo", "a/b.onnx", "v1")),
        ("hf://org/repo@v1.0/a/b.onnx", None, HubFile("org/repo", "a/b.onnx", "v1.0")),
        (
            "hf://org/repo@refs/pr/3/model.onnx",
            None,
            HubFile("org/repo", "model.onnx", "refs/pr/3"),
        ),
        (
            "hf://org/repo@my%2Fbranch/model.onnx",
            None,
            HubFile("org/repo", "model.onnx", "my/branch"),
        ),
        (
            "hf://org/repo@refs%2Fpr%2F3/model.onnx",
            None,
            HubFile("org/repo", "model.onnx", "refs/pr/3"),
        ),
        (("hf", "org/repo", "x/model.onnx"), "abc", HubFile("org/repo", "x/model.onnx", "abc")),
        ("model.onnx", None, None),
        (b"bytes", None, None),
    ],
)
def test_hub_sources(source, revision, expected):
    assert hub_file(source, revision) == expected
    if expected is not None:
        assert hub_file(expected.uri) == HubFile(expected.repo, expected.path, expected.revision)


@pytest.mark.parametrize(
    "source, revision, message",
    [
        ("hf://org/repo", None, "is not a Hub file"),
        ("hf://org/repo@v1/model.onnx", "v2", "give the revision once"),
        ("hf://org/repo/../model.onnx", None, "not a file path inside the repository"),
        ("hf://datasets/org/repo/model.onnx", None, "names a datasets repository"),
        ("hf://org/repo@/model.onnx", None, "empty revision"),
        (("hf", "org/repo", 3), None, "two strings"),
    ],
)
def test_malformed_hub_sources(source, revision, message):
    with pytest.raises(transmuter.ModelLoadError, match=message):
        hub_file(source, revision)


def test_a_repo_name_huggingface_hub_rejects_is_a_load_error(hub):
    with pytest.raises(transmuter.ModelLoadError, match="'hf://bad--name/x/model.onnx': .*repo_id"):
        transmuter.load("hf://bad--name/x/model.onnx")
    assert hub.requests == []


def test_a_revision_for_a_local_model_is_an_error():
    with pytest.raises(transmuter.TransmuterError, match="Hugging Face Hub sources only"):
        transmuter.load("model.onnx", revision="main")


def test_without_huggingface_hub_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import raises ImportError
    with pytest.raises(transmuter.ModelLoadError, match=r"pip install transmuter\[hub\]"):
        transmuter.load("hf://org/repo/model.onnx")


def test_cli_check_reads_a_hub_model_once(hub, events, capsys):
    """`transmuter check hf://...` compares against ONNX Runtime on the file the model was
    loaded from, without asking the Hub a second time."""
    from transmuter.cli import main

    hub.publish(REPO, {"model.onnx": add_model(WEIGHTS).SerializeToString()})
    assert main(["check", f"hf://{REPO}/model.onnx"]) == 0
    assert "ok" in capsys.readouterr().out
    assert kinds(events) == [
        "hub.info.start",
        "hub.info.stop",
        "hub.download.start",
        "hub.download.stop",
    ]
