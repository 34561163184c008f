"""ggml's RPC server in a process of its own, on a private loopback port: what `specgguf worker` supervises.

    python -m specgguf.llama.rpc_child PORT THREADS [CACHE_DIR]

It serves this machine's devices (those `rpc-server` would) on 127.0.0.1:PORT until it
is killed, crashes, or its parent (the worker, which relays to it) is gone.
"""

from __future__ import annotations

import os
import sys
import threading
import time

_STACK = 1 << 30  # address space, touched only as deep as a graph goes


def _leave_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def main(argv: list[str]) -> int:
    from .rpc_devices import rpc_server_devices, start_rpc_server

    port, threads = int(argv[0]), int(argv[1])
    cache_dir = argv[2] if len(argv) > 2 else None
    threading.Thread(target=_leave_with_parent, args=(os.getppid(),), daemon=True).start()
    devices = [device for device, _ in rpc_server_devices()]
    # ggml builds a received graph by recursion, one frame per tensor of a chain: a 256 MiB graph
    # (the most the relay passes on) is ~900,000 tensors, past the main thread's 8 MiB of stack.
    threading.stack_size(_STACK)
    server = threading.Thread(
        target=start_rpc_server,
        args=(f"127.0.0.1:{port}",),
        kwargs={"cache_dir": cache_dir, "n_threads": threads, "devices": devices},
    )
    server.start()
    server.join()
    return 1  # it returns only when it could not serve


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
