"""A local stand-in for the Hugging Face hub: the file endpoints huggingface_hub uses, on 127.0.0.1.

`HEAD/GET /{owner}/{name}/resolve/{revision}/{path}` answers as the hub does for an LFS
file: a 302 to a CDN with `X-Repo-Commit`, `X-Linked-Etag` (the file's SHA-256) and
`X-Linked-Size`. The CDN is a second server (another origin, as on the real hub) whose
`GET /cdn/{sha256}` serves the bytes and honours `Range`. Unknown repos, revisions and
files get the hub's 404s with `X-Error-Code`. Faults are scripted per file: drop the
connection after N bytes, stall after N bytes, or serve bytes that do not match the ETag.
Every request is logged, so tests can assert what was (not) downloaded.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


@dataclass
class Fault:
    drop_after: int | None = None  # close the connection after this many bytes (once)
    stall_after: int | None = None  # stop sending after this many bytes and hang (once)
    corrupt: bool = False  # serve other bytes than the ETag's


@dataclass
class Request:
    method: str
    path: str
    range: str | None


@dataclass
class FakeHub:
    repos: dict[str, dict] = field(default_factory=dict)  # repo -> {"commit": str, "files": {path: bytes}}
    faults: dict[str, Fault] = field(default_factory=dict)  # sha256 -> fault
    requests: list[Request] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    # A hostile hub: per repo, headers that replace the honest ones (e.g. a path as the ETag),
    # and repos whose resolve URL redirects to itself for ever.
    hostile_headers: dict[str, dict[str, str]] = field(default_factory=dict)
    redirect_loop: set[str] = field(default_factory=set)

    def add(self, repo: str, path: str, data: bytes, *, commit: str | None = None) -> str:
        """Publish `data` as `repo/path`; returns its SHA-256 (the LFS ETag)."""
        entry = self.repos.setdefault(repo, {"commit": commit or hashlib.sha1(repo.encode()).hexdigest(), "files": {}})
        entry["files"][path] = data
        return hashlib.sha256(data).hexdigest()

    def blob(self, sha256: str) -> bytes | None:
        for entry in self.repos.values():
            for data in entry["files"].values():
                if hashlib.sha256(data).hexdigest() == sha256:
                    return data
        return None

    def downloads(self) -> list[Request]:
        """The GETs of file bytes (huggingface_hub also asks the hub for other things, e.g. telemetry)."""
        return [r for r in self.requests if r.method == "GET" and r.path.startswith("/cdn/")]

    def file_requests(self) -> list[Request]:
        return [r for r in self.requests if "/resolve/" in r.path or r.path.startswith("/cdn/")]

    # --- servers ---
    def start(self) -> str:
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn=True))
        self._hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn=False))
        self.cdn_url = f"http://127.0.0.1:{self._cdn.server_port}"
        self.url = f"http://127.0.0.1:{self._hub.server_port}"
        for server in (self._cdn, self._hub):
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self.url

    def stop(self) -> None:
        self.stopping.set()
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()


def _handler(hub: FakeHub, *, cdn: bool):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep test output clean
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, *, body: bool) -> None:
            hub.requests.append(Request(self.command, self.path, self.headers.get("Range")))
            if cdn:
                self._serve_blob(unquote(self.path.removeprefix("/cdn/")).split("?")[0], body=body)
            else:
                self._resolve()

        def _resolve(self) -> None:
            parts = unquote(self.path).split("?")[0].strip("/").split("/")
            if len(parts) < 5 or parts[2] != "resolve":
                return self._error(404, "RepoNotFound")
            repo, revision, path = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            entry = hub.repos.get(repo)
            if entry is None:
                return self._error(404, "RepoNotFound")
            if revision not in ("main", entry["commit"]):
                return self._error(404, "RevisionNotFound")
            if path not in entry["files"]:
                return self._error(404, "EntryNotFound", commit=entry["commit"])
            data = entry["files"][path]
            sha256 = hashlib.sha256(data).hexdigest()
            self.send_response(302)
            headers = {
                "Location": f"{hub.cdn_url}/cdn/{sha256}?signed=1",
                "X-Repo-Commit": entry["commit"],
                "X-Linked-Etag": f'"{sha256}"',
                "X-Linked-Size": str(len(data)),
                "ETag": '"not-the-lfs-etag"',
                "Content-Length": "0",
            }
            if repo in hub.redirect_loop:
                headers["Location"] = f"{hub.url}{self.path}"
            headers.update(hub.hostile_headers.get(repo, {}))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()

        def _error(self, status: int, code: str, commit: str | None = None) -> None:
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _serve_blob(self, sha256: str, *, body: bool) -> None:
            data = hub.blob(sha256)
            if data is None:
                return self._error(404, "EntryNotFound")
            fault = hub.faults.get(sha256, Fault())
            if fault.corrupt:
                data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
            start = 0
            if self.headers.get("Range"):
                start = int(self.headers["Range"].removeprefix("bytes=").split("-")[0])
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            if not body:
                return
            self._send(data, start, fault)

        def _send(self, data: bytes, start: int, fault: Fault) -> None:
            limit = fault.drop_after if fault.drop_after is not None else fault.stall_after
            if limit is not None and start < limit:
                self.wfile.write(data[start:limit])
                self.wfile.flush()
                if fault.stall_after is not None:
                    fault.stall_after = None
                    hub.stopping.wait(60)  # the client gives up (or is interrupted) first
                fault.drop_after = None
                self.close_connection = True
                return
            self.wfile.write(data[start:])

    return Handler
