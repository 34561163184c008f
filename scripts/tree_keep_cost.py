"""What it costs to keep a draft-tree path that ends on a sibling exactly (llama/tree.py says why the
sibling cannot stay where the batch put it), three ways: evaluate the sibling again at once (a
one-token pass of its own), compact the cache (save and restore sequence 0, as the server's cache
slots do), or what LlamaModel does, feed it again as one more token of the next verify batch.
Interleaved repeats, medians; quiet machine only:

    .venv/bin/python scripts/tree_keep_cost.py -m tests/.../SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specgguf.bench.trace_servers import run_script  # noqa: E402
from specgguf.llama.model import LlamaModel  # noqa: E402

DRAFTS = list(range(500, 507))  # a chain of 6, and a sibling of its first draft
DRAFT_PARENTS = [-1, 0, 1, 2, 3, 4, 0]


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", required=True, type=Path)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("-t", type=int, default=2)
    args = parser.parse_args()
    model = LlamaModel(args.m, n_ctx=args.context + 64, n_threads=args.t)
    model.eval([100 + i % 300 for i in range(args.context)], n_logits=0)
    base = model.n_past
    one = [900]  # the pending token, then the drafts
    two = [900, 901]  # a sibling left over from the last step, then the pending token
    results: dict[str, list[float]] = {}

    def add(name: str, seconds: float) -> None:
        results.setdefault(name, []).append(seconds)

    def verify(pending: list[int]) -> None:
        parents = list(range(-1, len(pending) - 1)) + [parent + len(pending) for parent in DRAFT_PARENTS]
        model.eval_tree(pending + DRAFTS, parents, n_logits=len(DRAFTS) + 1)

    for _ in range(args.repeats):
        for name, pending in (("verify batch, 1 pending token", one), ("verify batch, 2 pending tokens", two)):
            add(name, timed(functools.partial(verify, pending)))
            model.rewind(base)
        add("evaluate the sibling again at once", timed(lambda: model.eval([901], n_logits=0)))
        add("compact: save and restore sequence 0", timed(lambda: model.load_state(*model.save_state())))
        model.rewind(base)
    print(f"{args.m.name}, -t {args.t}, {args.repeats} repeats, context {base} tokens: median ms")
    for name, values in results.items():
        print(f"  {name:<42} {statistics.median(values) * 1000:7.2f}")


if __name__ == "__main__":
    run_script(main)  # with the program's huge pages, an error one line
