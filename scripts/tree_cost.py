"""What a draft tree costs the verifier beside a chain of as many tokens, and what the tree-ready
context (a unified KV cache with 16 sequences) costs plain decoding against llama.cpp's default
one-sequence context. Interleaved repeats, medians; quiet machine only:

    .venv/bin/python scripts/tree_cost.py -m ~/.cache/specgguf/qwen2.5-coder-1.5b-instruct-f16.gguf
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specgguf.bench.trace_servers import run_script  # noqa: E402
from specgguf.llama.model import LlamaModel  # noqa: E402

PROMPT = list(range(1000, 1300))  # 300 tokens of context


def one_sequence_context() -> None:
    """Make new contexts as llama.cpp's defaults do: one sequence, no unified cache."""
    original_init = llama_cpp.llama_init_from_model

    def init(model, params):
        params.n_seq_max, params.kv_unified = 1, False
        return original_init(model, params)

    llama_cpp.llama_init_from_model = init


def timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", required=True, type=Path)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("-t", type=int, default=2)
    args = parser.parse_args()
    model = LlamaModel(args.m, n_ctx=1024, n_threads=args.t)
    one_sequence_context()
    plain = LlamaModel(args.m, n_ctx=1024, n_threads=args.t)
    model.eval(PROMPT, n_logits=0)
    plain.eval(PROMPT, n_logits=0)
    base = model.n_past
    results: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for n in (4, 7):
            chain = list(range(2000, 2000 + n))
            tree_parents = [-1, *range(0, n - 2), n - 3]  # a chain of n-1 and one sibling of the last
            results.setdefault(f"chain of {n}", []).append(
                timed(lambda chain=chain, n=n: model.eval_tree(chain, list(range(-1, n - 1)), n_logits=n))
            )
            model.keep_path([0])
            model.rewind(base)
            results.setdefault(f"tree of {n} (1 sibling)", []).append(
                timed(lambda chain=chain, parents=tree_parents, n=n: model.eval_tree(chain, parents, n_logits=n))
            )
            model.keep_path([0])
            model.rewind(base)
        for name, m in (("16-sequence unified cache", model), ("default one-sequence cache", plain)):
            results.setdefault(f"plain token, {name}", []).append(
                timed(lambda m=m: [m.eval([3000 + i], n_logits=1) for i in range(8)]) / 8
            )
            m.rewind(base)
    print(f"{args.m.name}, -t {args.t}, {args.repeats} repeats, context {base} tokens: median ms")
    for name, values in results.items():
        print(f"  {name:<42} {statistics.median(values) * 1000:7.1f}")


if __name__ == "__main__":
    run_script(main)  # with the program's huge pages, an error one line
