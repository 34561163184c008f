"""What a web page may not make the local server do (DNS rebinding, cross-origin and "simple" POSTs),
hang-ups mid-body and a connection flood in the log: raw sockets against a real `specgguf serve`."""

from __future__ import annotations

import json
import resource
import socket
import time

import httpx
import pytest

from live_server import live_server

BODY = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}).encode()
SITE = "http://app.example:3000"


@pytest.fixture(scope="module")
def server(tiny_verifier):
    with live_server(
        "-m", tiny_verifier, "-c", "256", "-t", "1", "-n", "4",
        "--allowed-hosts", "gpu-box,proxy.internal:443", "--cors-origin", SITE,
    ) as live:  # fmt: skip
        yield live


def raw(port: int, request: bytes, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request over a plain socket: (status, headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def request(method: str, path: str, *, host: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def openai_error(status: int, body: bytes) -> dict:
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], body
    return error


def test_a_simple_cross_site_post_is_refused_with_415(server):
    here = f"127.0.0.1:{server.port}"
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {"Content-Type": content_type} if content_type else {}
        status, _, body = raw(
            server.port, request("POST", "/v1/chat/completions", host=here, headers=headers, body=BODY)
        )
        assert status == 415 and openai_error(status, body)["code"] == "unsupported_media"
    json_type = {"Content-Type": "application/json; charset=utf-8"}
    status, _, body = raw(server.port, request("POST", "/v1/chat/completions", host=here, headers=json_type, body=BODY))
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize(
    "host, allowed",
    [
        ("127.0.0.1:{port}", True),
        ("localhost:{port}", True),
        ("LocalHost:{port}", True),
        ("[::1]:{port}", True),
        ("gpu-box:{port}", True),  # --allowed-hosts gpu-box: with our port
        ("proxy.internal:443", True),  # --allowed-hosts proxy.internal:443: exactly
        ("attacker.example:{port}", False),  # DNS rebinding: a page's own name, resolved to 127.0.0.1
        ("localhost.attacker.example:{port}", False),
        ("127.0.0.1:1", False),  # another port
        ("localhost", False),  # no port, and ours is not 80
        ("gpu-box:443", False),
        ("", False),
    ],
)
def test_only_host_values_naming_this_server_are_answered(server, host, allowed):
    host = host.format(port=server.port)
    for path in ("/v1/models", "/metrics"):
        status, _, body = raw(server.port, request("GET", path, host=host))
        if allowed:
            assert status == 200
        else:
            assert status == 403 and openai_error(status, body)["code"] == "host_not_allowed"


def test_cross_origin_requests_only_for_named_origins(server):
    here = f"127.0.0.1:{server.port}"
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,authorization",
    }
    for origin in ("http://attacker.example", "null", f"https://127.0.0.1:{server.port}", SITE + ".evil.example"):
        for method, headers in (("OPTIONS", preflight), ("GET", {})):
            status, reply, body = raw(
                server.port, request(method, "/v1/models", host=here, headers={"Origin": origin, **headers})
            )
            assert status == 403 and openai_error(status, body)["code"] == "cors_denied"
            assert "access-control-allow-origin" not in reply
    status, reply, _ = raw(
        server.port, request("OPTIONS", "/v1/chat/completions", host=here, headers={"Origin": SITE, **preflight})
    )
    assert status == 200 and reply["access-control-allow-origin"] in (SITE, "*")
    assert "POST" in reply["access-control-allow-methods"]
    status, reply, _ = raw(server.port, request("GET", "/v1/models", host=here, headers={"Origin": SITE}))
    assert status == 200 and reply["access-control-allow-origin"] in (SITE, "*")
    same = {"Origin": f"http://{here}", "Content-Type": "application/json"}  # a page of this server itself
    status, _, _ = raw(server.port, request("POST", "/v1/chat/completions", host=here, headers=same, body=BODY))
    assert status == 200


def test_a_client_hanging_up_mid_body_is_no_traceback(tiny_verifier):
    with live_server("-m", tiny_verifier, "-c", "256", "-t", "1", "-n", "4") as live:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", live.port)) as sock:
                head = request("POST", "/v1/chat/completions", host=f"127.0.0.1:{live.port}",
                               headers={"Content-Type": "application/json"})  # fmt: skip
                sock.sendall(head.replace(b"Content-Length: 0", b"Content-Length: 5000") + BODY[:10])
                time.sleep(0.3)
        with live.http() as http:
            assert http.get("/health").status_code == 200
            assert (
                http.post(
                    "/v1/chat/completions", content=BODY, headers={"Content-Type": "application/json"}
                ).status_code
                == 200
            )
    assert "Traceback" not in live.stderr and "ClientDisconnect" not in live.stderr
    assert len(live.stderr.splitlines()) <= 5, live.stderr  # the banner and the stop line, at most a line each


def test_a_connection_flood_with_no_file_descriptors_left_logs_a_few_lines(tiny_verifier):
    with live_server("-m", tiny_verifier, "-c", "256", "-t", "1", "-n", "4") as live:
        limit = resource.prlimit(live.process.pid, resource.RLIMIT_NOFILE)
        open_now = len(list(__import__("pathlib").Path(f"/proc/{live.process.pid}/fd").iterdir()))
        resource.prlimit(live.process.pid, resource.RLIMIT_NOFILE, (open_now + 8, limit[1]))
        flood = []
        try:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                try:
                    flood.append(socket.create_connection(("127.0.0.1", live.port), timeout=1))
                except OSError:
                    time.sleep(0.01)
                if len(flood) > 200:
                    flood.pop(0).close()
        finally:
            for sock in flood:
                sock.close()
            resource.prlimit(live.process.pid, resource.RLIMIT_NOFILE, limit)
        time.sleep(1.5)
        with httpx.Client(base_url=live.base_url, timeout=30) as http:
            assert http.get("/health").status_code == 200  # still serving
    lines = live.stderr.splitlines()
    assert "Traceback" not in live.stderr and len(lines) <= 12, live.stderr[:3000]
    assert all(len(line) <= 400 for line in lines)


def test_a_non_ascii_api_key_is_refused_at_start(cli, tiny_verifier):
    line = cli("serve", "-m", tiny_verifier, "--api-key", "clé-secrète").error_line()
    assert "--api-key must be printable ASCII" in line
    assert "ASCII" in cli("serve", "-m", tiny_verifier, env={"SPECGGUF_API_KEY": "ключ"}).error_line()


def test_bad_cors_origins_and_hosts_are_one_line(cli, tiny_verifier):
    assert "--cors-origin 'evil'" in cli("serve", "-m", tiny_verifier, "--cors-origin", "evil").error_line()
    from_env = cli("serve", "-m", tiny_verifier, env={"SPECGGUF_ORIGINS": "http://a.example,ftp://b"}).error_line()
    assert "--cors-origin 'ftp://b'" in from_env
    assert "--allowed-hosts" in cli("serve", "-m", tiny_verifier, "--allowed-hosts", "a/b").error_line()


def test_a_subnormal_temperature_is_greedy_in_the_server_too(server):
    def answer(temperature: float) -> str:
        body = {"prompt": "the cat", "max_tokens": 6, "temperature": temperature, "seed": 3}
        with server.http() as http:
            response = http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]

    assert answer(1e-320) == answer(0.0)


def test_allowing_every_host_does_not_allow_every_origin():
    from specgguf.serve.guard import HostPolicy

    policy = HostPolicy("127.0.0.1", 8080, allowed_hosts=("*",))
    assert policy.host_allowed("anything.example:1234")
    assert not policy.origin_allowed("http://anything.example:1234")
    assert policy.origin_allowed("http://localhost:8080")  # the server's own pages
    assert HostPolicy("127.0.0.1", 8080, cors_origins=("*",)).origin_allowed("https://any.example")
    everywhere = HostPolicy("0.0.0.0", 8080)
    assert everywhere.host_allowed("192.168.1.20:8080") and not everywhere.host_allowed("evil.example:8080")
