"""A real `specgguf serve` subprocess on 127.0.0.1 and a free port, for the server tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    def __init__(self, process: subprocess.Popen, port: int, api_key: str | None):
        self.process, self.port, self.api_key = process, port, api_key
        self.base_url = f"http://127.0.0.1:{port}"
        self.stderr = ""

    def client(self, **options):
        """The real openai SDK, pointed at this server."""
        from openai import OpenAI

        options = {"max_retries": 0, "api_key": self.api_key or "unused", **options}
        return OpenAI(base_url=self.base_url + "/v1", **options)

    def http(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=60)

    def metric(self, name: str) -> float:
        """One sample's value from /metrics (summed over its labels)."""
        with self.http() as http:
            text = http.get("/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and line[len(name)] in " {"
        )

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            _, self.stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, self.stderr = self.process.communicate()
            raise
        return self.process.returncode


def wait_until_healthy(server: LiveServer, timeout: float) -> None:
    """Until the server's /health answers 200; RuntimeError when its process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            stderr = server.process.stderr.read() if server.process.stderr else ""
            raise RuntimeError(f"the server exited ({server.process.returncode}): {stderr}")
        try:
            if httpx.get(server.base_url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not come up")
        time.sleep(0.1)


@contextlib.contextmanager
def live_server(*args, api_key: str | None = None, startup_timeout: float = 60, env: dict[str, str] | None = None):
    port = free_port()
    env = {name: value for name, value in (os.environ if env is None else env).items() if name != "SPECGGUF_API_KEY"}
    if api_key:
        env["SPECGGUF_API_KEY"] = api_key
    process = subprocess.Popen(
        [sys.executable, "-m", "specgguf", "serve", *map(str, args), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    server = LiveServer(process, port, api_key)
    try:
        wait_until_healthy(server, startup_timeout)
        yield server
        returncode = server.stop()  # Ctrl-C: a clean exit
        assert returncode == 0 and "Traceback" not in server.stderr, server.stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
