"""A local, in-memory stand-in for the Hugging Face Hub, for tests. Standard library only.

    with HubServer() as hub:            # 127.0.0.1, a free port, files in a temporary directory
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "dummy"}
        ...                             # huggingface_hub / transformers in a process with that environment
        hub.read_file("user/repo", "README.md")

It answers the part of the Hub API that huggingface_hub 2.x and transformers 5.x use to push and load models:

* POST /api/repos/create, /api/repos/delete, GET /api/whoami-v2, POST /api/validate-yaml (accepts everything);
* GET /api/{type}s/{repo}[/revision/{rev}] (repo info), /tree/{rev}[/{path}], /refs, /commits/{rev};
* POST /api/{type}s/{repo}/preupload/{rev}: every file is uploaded "regular", i.e. inline in the commit;
* POST /api/{type}s/{repo}/commit/{rev}: NDJSON header + file / deletedFile / deletedFolder lines
  (LFS and Xet uploads are refused: the preupload answer never asks for them);
* POST|DELETE /api/{type}s/{repo}/branch/{branch};
* HEAD|GET /[{type}s/]{repo}/resolve/{rev}/{path} with ETag, X-Repo-Commit, Content-Length, and 404 answers carrying
  X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound as the Hub does.

Every repo starts with an initial commit holding `.gitattributes`, as on the Hub. Commits are full snapshots
({path: blob sha}); blobs live in the temporary directory, named by their git blob sha1. Any token is accepted.
Every request is appended to `HubServer.requests` as (method, path) for tests to inspect.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

REPO_TYPES = ("model", "dataset", "space")
DEFAULT_BRANCH = "main"
USER = "user"
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n"


def git_blob_sha1(data: bytes) -> str:
    """`git hash-object` of `data`: what the Hub reports as the oid / ETag of a regular file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _iso(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(timestamp))


class HubError(Exception):
    """An error answer: HTTP status, X-Error-Code (or None) and message."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


@dataclass
class Commit:
    oid: str
    files: dict[str, str]  # path -> blob sha1
    title: str
    message: str
    parents: list[str]
    date: float


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    created: float
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit oid
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit:
        oid = self.branches.get(revision) or self.tags.get(revision)
        if oid is None and revision in self.commits:
            oid = revision
        if oid is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return self.commits[oid]


class HubServer:
    """The server: `start()` / `stop()` or use it as a context manager. `url` is the HF_ENDPOINT to use."""

    def __init__(self, root: str | Path | None = None):
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="posformers-hub-")) if root is None else Path(root)
        self.blobs = self.root / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.repos: dict[tuple[str, str], Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.RLock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("HubServer is not running")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubServer:
        handler = type("HubRequestHandler", (_Handler,), {"hub": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hub-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=10)
            self._httpd = self._thread = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- storage ------------------------------------------------------------------------------------------------------

    def _store_blob(self, data: bytes) -> str:
        oid = git_blob_sha1(data)
        path = self.blobs / oid
        if not path.exists():
            tmp = path.with_suffix(f".tmp{threading.get_ident()}")
            tmp.write_bytes(data)
            tmp.replace(path)
        return oid

    def _blob(self, oid: str) -> bytes:
        return (self.blobs / oid).read_bytes()

    def _repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, f"Repository Not Found for url: {repo_type}s/{repo_id}.", "RepoNotFound")
        return repo

    def _commit(
        self,
        repo: Repo,
        branch: str,
        files: dict[str, str],
        title: str,
        message: str = "",
        parent_commit: str | None = None,
    ) -> Commit:
        head = repo.branches.get(branch)
        if head is None:
            raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
        if parent_commit is not None and parent_commit != head:
            raise HubError(412, f"A commit has happened since. Please refresh and try again. ({head})")
        now = time.time()
        digest = hashlib.sha1(json.dumps([head, sorted(files.items()), title, message, now]).encode()).hexdigest()
        commit = Commit(digest, dict(files), title, message, [head], now)
        repo.commits[commit.oid] = commit
        repo.branches[branch] = commit.oid
        return commit

    def create_repo(self, repo_id: str, repo_type: str = "model", private: bool = False) -> Repo:
        """Create a repo (with its initial commit), as POST /api/repos/create does. Raises HubError 409 if it exists."""
        with self.lock:
            if (repo_type, repo_id) in self.repos:
                raise HubError(409, f"You already created this {repo_type} repo")
            now = time.time()
            initial = Commit(
                hashlib.sha1(f"{repo_type}/{repo_id}@{now}".encode()).hexdigest(),
                {".gitattributes": self._store_blob(GITATTRIBUTES)},
                "initial commit",
                "",
                [],
                now,
            )
            repo = Repo(repo_type, repo_id, private, now, {initial.oid: initial}, {DEFAULT_BRANCH: initial.oid})
            self.repos[(repo_type, repo_id)] = repo
            return repo

    # -- inspection helpers for tests --------------------------------------------------------------------------------

    def list_files(self, repo_id: str, revision: str = DEFAULT_BRANCH, repo_type: str = "model") -> list[str]:
        with self.lock:
            return sorted(self._repo(repo_type, repo_id).resolve(revision).files)

    def read_file(self, repo_id: str, path: str, revision: str = DEFAULT_BRANCH, repo_type: str = "model"):
        """Bytes of `path` at `revision`, or None if the file is not there."""
        with self.lock:
            oid = self._repo(repo_type, repo_id).resolve(revision).files.get(path)
            return None if oid is None else self._blob(oid)

    def history(self, repo_id: str, revision: str = DEFAULT_BRANCH, repo_type: str = "model") -> list[Commit]:
        """Commits reachable from `revision`, newest first."""
        with self.lock:
            repo = self._repo(repo_type, repo_id)
            commits, commit = [], repo.resolve(revision)
            while True:
                commits.append(commit)
                if not commit.parents:
                    return commits
                commit = repo.commits[commit.parents[0]]

    def write_file(
        self,
        repo_id: str,
        path: str,
        data: bytes,
        *,
        revision: str = DEFAULT_BRANCH,
        repo_type: str = "model",
        title: str | None = None,
    ) -> str:
        """Commit one file directly on the server (like an edit in the Hub's web UI); returns the commit oid."""
        with self.lock:
            repo = self._repo(repo_type, repo_id)
            files = {**repo.resolve(revision).files, path: self._store_blob(data)}
            return self._commit(repo, revision, files, title or f"Update {path}").oid


# ---------------------------------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer  # set on the subclass HubServer.start creates
    protocol_version = "HTTP/1.1"
    server_version = "posformers-test-hub/1.0"

    # BaseHTTPRequestHandler logs every request to stderr; HubServer.requests records them instead.
    def log_message(self, format, *args):
        pass

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    # -- plumbing ------------------------------------------------------------------------------------------------------

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    @staticmethod
    def _json(body: bytes):
        try:
            return json.loads(body or b"{}")
        except json.JSONDecodeError as error:
            raise HubError(400, f"Invalid JSON body: {error}") from error

    def _send(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "application/json",
        headers: dict | None = None,
        method: str = "GET",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Date", formatdate(usegmt=True))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if method != "HEAD" and body:
            self.wfile.write(body)

    def _send_json(self, payload, status: int = 200, headers: dict | None = None, method: str = "GET") -> None:
        self._send(status, json.dumps(payload).encode(), headers=headers, method=method)

    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        self.hub.requests.append((method, split.path))
        query = {key: values[-1] for key, values in parse_qs(split.query).items()}
        segments = [segment for segment in split.path.split("/") if segment]
        try:
            # The body must be consumed before answering, or a keep-alive connection gets out of step.
            body = self._body()
            if segments[:1] == ["api"]:
                self._api(method, segments[1:], query, body)
            else:
                self._resolve(method, segments)
        except HubError as error:
            headers = {"X-Error-Message": error.message, **error.headers}
            if error.code:
                headers["X-Error-Code"] = error.code
            self._send_json({"error": error.message}, error.status, headers, method)
        except Exception as error:  # a bug here must surface as an HTTP error in the client, not a hang
            self._send_json({"error": f"{type(error).__name__}: {error}"}, 500, method=method)

    # -- /api -------------------------------------------------------------------------------------------------------

    def _api(self, method: str, segments: list[str], query: dict, body: bytes) -> None:
        hub = self.hub
        if segments == ["whoami-v2"]:
            return self._send_json(
                {
                    "type": "user",
                    "name": USER,
                    "fullname": USER,
                    "orgs": [],
                    "auth": {"type": "access_token", "accessToken": {"displayName": "test", "role": "write"}},
                }
            )
        if segments == ["validate-yaml"] and method == "POST":
            return self._send_json({"errors": [], "warnings": []})
        if segments[:1] == ["repos"] and method == "POST":
            return self._repos(segments[1:], self._json(body))
        if len(segments) < 3 or segments[0].rstrip("s") not in REPO_TYPES or not segments[0].endswith("s"):
            raise HubError(404, f"Not found: /api/{'/'.join(segments)}")
        repo_type = segments[0][:-1]
        repo_id = f"{unquote(segments[1])}/{unquote(segments[2])}"
        action, rest = (segments[3], segments[4:]) if len(segments) > 3 else (None, [])
        with hub.lock:
            repo = hub._repo(repo_type, repo_id)
            if action is None and method == "GET":
                return self._send_json(self._info(repo, repo.resolve(DEFAULT_BRANCH)))
            if action == "revision" and rest and method == "GET":
                return self._send_json(self._info(repo, repo.resolve(unquote(rest[0]))))
            if action == "preupload" and rest and method == "POST":
                return self._preupload(repo, unquote(rest[0]), body)
            if action == "commit" and rest and method == "POST":
                return self._commit_ndjson(repo, unquote(rest[0]), query, body)
            if action == "branch" and rest:
                return self._branch(repo, method, unquote(rest[0]), body)
            if action == "tree" and rest and method == "GET":
                path = unquote("/".join(rest[1:]))
                return self._tree(repo, repo.resolve(unquote(rest[0])), path, query)
            if action == "refs" and method == "GET":
                return self._send_json(
                    {
                        "branches": [
                            {"name": name, "ref": f"refs/heads/{name}", "targetCommit": oid}
                            for name, oid in repo.branches.items()
                        ],
                        "tags": [
                            {"name": name, "ref": f"refs/tags/{name}", "targetCommit": oid}
                            for name, oid in repo.tags.items()
                        ],
                        "converts": [],
                    }
                )
            if action == "commits" and rest and method == "GET":
                commits = hub.history(repo_id, unquote(rest[0]), repo_type)
                return self._send_json(
                    [
                        {
                            "id": c.oid,
                            "title": c.title,
                            "message": c.message,
                            "date": _iso(c.date),
                            "authors": [{"user": USER}],
                        }
                        for c in commits
                    ]
                )
        raise HubError(404, f"Not found: {method} /api/{'/'.join(segments)}")

    def _repos(self, segments: list[str], payload: dict) -> None:
        repo_type = payload.get("type") or "model"
        if repo_type not in REPO_TYPES:
            raise HubError(400, f"Invalid repo type {repo_type!r}")
        repo_id = f"{payload.get('organization') or USER}/{payload['name']}"
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        url = f"{self.hub.url}/{prefix}{repo_id}"
        if segments == ["create"]:
            try:
                self.hub.create_repo(repo_id, repo_type, private=payload.get("visibility") == "private")
            except HubError as error:
                return self._send_json({"error": error.message, "url": url}, error.status)
            return self._send_json({"url": url, "name": repo_id, "id": repo_id})
        if segments == ["delete"]:
            with self.hub.lock:
                self.hub._repo(repo_type, repo_id)
                del self.hub.repos[(repo_type, repo_id)]
            return self._send_json({})
        raise HubError(404, f"Not found: /api/repos/{'/'.join(segments)}")

    def _info(self, repo: Repo, commit: Commit) -> dict:
        return {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit.oid,
            "lastModified": _iso(commit.date),
            "createdAt": _iso(repo.created),
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": [{"rfilename": path} for path in sorted(commit.files)],
        }

    def _preupload(self, repo: Repo, revision: str, body: bytes) -> None:
        files = self._json(body).get("files", [])
        try:
            current = repo.resolve(revision).files
        except HubError:
            current = {}  # e.g. a PR or branch that does not exist yet
        self._send_json(
            {
                "files": [
                    {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": current.get(f["path"])}
                    for f in files
                ],
                "commitOid": None,
            }
        )

    def _commit_ndjson(self, repo: Repo, revision: str, query: dict, body: bytes) -> None:
        if query.get("create_pr") in ("1", "true", "True"):
            raise HubError(400, "This test Hub does not implement pull requests (create_pr)")
        if revision not in repo.branches:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        files = dict(repo.resolve(revision).files)
        header = {}
        for line in (body or b"").splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item.get("key"), item.get("value", {})
            if key == "header":
                header = value
            elif key == "file":
                if value.get("encoding", "base64") != "base64":
                    raise HubError(400, f"Unsupported encoding {value.get('encoding')!r}")
                files[value["path"]] = self.hub._store_blob(base64.b64decode(value["content"]))
            elif key == "deletedFile":
                if files.pop(value["path"], None) is None:
                    raise HubError(404, f"A file with this name doesn't exist: {value['path']}", "EntryNotFound")
            elif key == "deletedFolder":
                folder = value["path"].rstrip("/") + "/"
                files = {path: oid for path, oid in files.items() if not path.startswith(folder)}
            else:
                raise HubError(422, f"This test Hub only takes inline ('regular') files, not {key!r}")
        commit = self.hub._commit(
            repo,
            revision,
            files,
            header.get("summary") or "Update",
            header.get("description") or "",
            header.get("parentCommit"),
        )
        prefix = "" if repo.repo_type == "model" else f"{repo.repo_type}s/"
        self._send_json(
            {
                "success": True,
                "commitOid": commit.oid,
                "commitUrl": f"{self.hub.url}/{prefix}{repo.repo_id}/commit/{commit.oid}",
                "pullRequestUrl": None,
            }
        )

    def _branch(self, repo: Repo, method: str, branch: str, body: bytes) -> None:
        if method == "POST":
            if branch in repo.branches:
                raise HubError(409, f"Reference already exists: refs/heads/{branch}")
            start = self._json(body).get("startingPoint") or DEFAULT_BRANCH
            repo.branches[branch] = repo.resolve(start).oid
            return self._send_json({})
        if method == "DELETE":
            if branch not in repo.branches or branch == DEFAULT_BRANCH:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            del repo.branches[branch]
            return self._send_json({})
        raise HubError(405, f"{method} not allowed on branches")

    def _tree(self, repo: Repo, commit: Commit, path: str, query: dict) -> None:
        prefix = f"{path.rstrip('/')}/" if path else ""
        recursive = query.get("recursive", "").lower() in ("1", "true")
        entries, folders = [], set()
        for file_path, oid in sorted(commit.files.items()):
            if not file_path.startswith(prefix):
                continue
            parts = file_path[len(prefix) :].split("/")
            for depth in range(1, len(parts)):
                folder = prefix + "/".join(parts[:depth])
                if (recursive or depth == 1) and folder not in folders:
                    folders.add(folder)
                    entries.append(
                        {
                            "type": "directory",
                            "oid": hashlib.sha1(folder.encode()).hexdigest(),
                            "size": 0,
                            "path": folder,
                        }
                    )
            if recursive or len(parts) == 1:
                size = (self.hub.blobs / oid).stat().st_size
                entries.append({"type": "file", "oid": oid, "size": size, "path": file_path})
        if path and not entries and path not in commit.files:
            raise HubError(404, f"{path} does not exist on {commit.oid}", "EntryNotFound")
        self._send_json(entries)

    # -- /{repo}/resolve/{revision}/{path} -----------------------------------------------------------------------------

    def _resolve(self, method: str, segments: list[str]) -> None:
        if method not in ("GET", "HEAD"):
            raise HubError(405, f"{method} not allowed")
        repo_type = "model"
        if segments and segments[0] in ("datasets", "spaces"):
            repo_type, segments = segments[0][:-1], segments[1:]
        if len(segments) < 5 or segments[2] != "resolve":
            raise HubError(404, f"Not found: {self.path}")
        repo_id = f"{unquote(segments[0])}/{unquote(segments[1])}"
        revision, path = unquote(segments[3]), unquote("/".join(segments[4:]))
        with self.hub.lock:
            commit = self.hub._repo(repo_type, repo_id).resolve(revision)
            oid = commit.files.get(path)
            if oid is None:
                raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
            data = self.hub._blob(oid)
        headers = {
            "ETag": f'"{oid}"',
            "X-Repo-Commit": commit.oid,
            "Accept-Ranges": "bytes",
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}",
        }
        status = 200
        byte_range = self.headers.get("Range", "")
        if byte_range.startswith("bytes=") and method == "GET":
            start, _, end = byte_range[len("bytes=") :].partition("-")
            start = int(start or 0)
            end = int(end) if end else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start : end + 1], HTTPStatus.PARTIAL_CONTENT
        self._send(status, data, "application/octet-stream", headers, method)
