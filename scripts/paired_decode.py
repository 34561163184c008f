"""Plain decoding's cost per token, paired in one process (issue 45): two ways of decoding the same greedy
answer take turns token by token (the order alternating), so machine drift hits both alike and the median
of per-token ratios resolves a 1% difference that separate runs (±15% between processes on a 2-core VM)
cannot. Quiet machine only.

    .venv/bin/python scripts/paired_decode.py -m VERIFIER.gguf -n 128 --compare ours
    .venv/bin/python scripts/paired_decode.py -m VERIFIER.gguf -n 128 --compare context

`ours`: specgguf's whole path per token (`LlamaModel.eval`: the load governor's check, the stop check, the
batch fill, the logits copy) against a bare `llama_decode` and logits copy over the same weights. `context`:
a context as LlamaModel makes it (one sequence per draft-tree leaf, unified KV) against llama-completion's
(one sequence), both bare.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_cpp  # noqa: E402

from specgguf.bench.machine import cpu  # noqa: E402
from specgguf.bench.trace_servers import run_script  # noqa: E402
from specgguf.llama.model import MAX_TREE_LEAVES, LlamaModel  # noqa: E402

PROMPT = (
    "<|im_start|>user\nWrite a Python function that parses an ISO date and returns a datetime, with tests."
    "<|im_end|>\n<|im_start|>assistant\n"
)


class Bare:
    """A context of its own over `model`'s weights, decoded with llama_decode and nothing else."""

    def __init__(self, model: LlamaModel, n_seq: int):
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = 4096, 512, 512
        params.n_seq_max, params.kv_unified = n_seq, n_seq > 1
        params.n_threads = params.n_threads_batch = model.n_threads
        self.context = llama_cpp.llama_init_from_model(model._model, params)
        self.batch = llama_cpp.llama_batch_init(512, 0, n_seq)
        self.n_vocab, self.n_past = model.n_vocab, 0

    def eval(self, tokens: list[int]) -> np.ndarray:
        batch: Any = self.batch
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, self.n_past + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        if llama_cpp.llama_decode(self.context, batch) != 0:
            raise SystemExit("llama_decode failed")
        self.n_past += len(tokens)
        row = llama_cpp.llama_get_logits_ith(self.context, -1)
        return np.ctypeslib.as_array(row, shape=(self.n_vocab,)).copy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", required=True, type=Path, help="the verifier GGUF")
    parser.add_argument("-n", type=int, default=128, help="tokens")
    parser.add_argument("-t", type=int, default=2, help="threads")
    parser.add_argument("--compare", choices=("ours", "context"), default="ours")
    args = parser.parse_args()
    machine = cpu()
    print(f"CPU: {machine['cpu']} ({machine['cores']} cores), -t {args.t}, {args.m.name}, {args.n} tokens")
    model = LlamaModel(args.m, n_ctx=4096, n_threads=args.t)
    prompt = model.tokenize(PROMPT)
    if args.compare == "ours":
        names = ("LlamaModel.eval", "bare llama_decode")
        bare = Bare(model, 1)
        sides = (lambda tokens: model.eval(tokens, n_logits=1)[-1], bare.eval)
    else:
        names = (f"n_seq_max {MAX_TREE_LEAVES} + unified KV", "n_seq_max 1")
        first, second = Bare(model, MAX_TREE_LEAVES), Bare(model, 1)
        sides = (first.eval, second.eval)
    token = int(np.argmax(sides[0](prompt)))
    sides[1](prompt)
    seconds: tuple[list[float], list[float]] = ([], [])
    for i in range(args.n):
        following = token
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            started = time.perf_counter()
            logits = sides[side]([token])
            seconds[side].append(time.perf_counter() - started)
            if side == 0:
                following = int(np.argmax(logits))
        token = following
    ratios = [a / b for a, b in zip(*seconds)]
    for name, times in zip(names, seconds):
        print(f"{name:>32}: {1000 * statistics.median(times):.2f} ms a token (median)")
    print(f"paired {names[0]} / {names[1]}: median {statistics.median(ratios):.4f}, mean {statistics.mean(ratios):.4f}")


if __name__ == "__main__":
    run_script(main)  # with the program's huge pages, an error one line
