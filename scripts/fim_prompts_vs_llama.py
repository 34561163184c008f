"""The FIM prompt each server evaluates for the editor trace's first requests, compared token by token.

    PYTHONPATH=. .venv/bin/python scripts/fim_prompts_vs_llama.py --vs-llama-server PATH [-m VERIFIER] [-n 3]

specgguf's side is its own rendering (conversation.fill_in_middle over the verifier's tokenizer, as
serve/plan.py calls it, with the request's n_predict). llama-server's side is what it evaluated: each
/infill is sent (n_predict 1), then its slot is read back (/slots with LLAMA_SERVER_SLOTS_DEBUG=1: the
prompt as text, special tokens written out) and its `tokens_evaluated` counted. specgguf's ids are
written out by llama-server's own /detokenize, so both texts come from one detokenizer; equal texts
and equal counts mean the same ids (a different split of the same text would change the count).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx

from specgguf.bench.trace_servers import PairSettings, ServerSpec, llama_server_specs, running
from specgguf.bench.traces import load_trace
from specgguf.conversation import FimRequest, Prompts, fill_in_middle
from specgguf.files.resolve import resolve_pair
from specgguf.llama.model import LlamaModel


def ours(prompts: Prompts, framing, body: dict, n_ctx: int) -> list[int]:
    fim = FimRequest(
        body.get("input_prefix", ""),
        body.get("input_suffix", ""),
        tuple((chunk.get("filename", "tmp"), chunk.get("text", "")) for chunk in body.get("input_extra", [])),
        body.get("prompt", ""),
    )
    n_predict = body.get("n_predict")
    n_predict = 4096 if n_predict in (None, -1) else max(1, n_predict)  # as serve/apis/infill.py limits it
    return fill_in_middle(prompts, fim, framing, n_ctx=n_ctx, n_predict=n_predict)


def first_difference(a: str, b: str) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vs-llama-server", type=Path, required=True)
    parser.add_argument("-m")
    parser.add_argument("-n", type=int, default=3, help="the trace's first N requests")
    parser.add_argument("-c", type=int, default=8192)
    parser.add_argument("-t", type=int, default=2)
    args = parser.parse_args()
    resolved = resolve_pair(model=args.m, model_draft=None, pair=None)
    verifier = LlamaModel(resolved.verifier, n_ctx=args.c, n_threads=args.t)
    prompts, framing = Prompts(verifier), verifier.fim_tokens()
    assert framing is not None, "the verifier has no FIM tokens"
    pair = PairSettings(resolved.verifier, resolved.verifier, args.t, args.c)
    plain = llama_server_specs(args.vs_llama_server, pair, draft_ks=[], ngram_types=[])[0]
    spec = ServerSpec(plain.name, plain.command, (("LLAMA_SERVER_SLOTS_DEBUG", "1"),))
    trace = load_trace("editor").cut(args.n)
    with running([spec]) as (server,), httpx.Client(base_url=server.base_url, timeout=600) as http:
        for request in trace.requests:
            body = dict(request.body) | {"n_predict": 1, "stream": False, "samplers": ["top_k"], "top_k": 1}
            answer = http.post("/infill", json=body).json()
            slot_text = http.get("/slots").json()[0].get("prompt", "")
            tokens = ours(prompts, framing, request.body, args.c)
            our_text = http.post("/detokenize", json={"tokens": tokens}).json()["content"]
            where = first_difference(our_text, slot_text)
            print(
                json.dumps(
                    {
                        "line": request.line,
                        "n_predict": request.body.get("n_predict"),
                        "specgguf_tokens": len(tokens),
                        "llama_server_tokens_evaluated": answer.get("tokens_evaluated"),
                        "texts_equal": where is None,
                        "first_difference": where,
                        "specgguf_near": None if where is None else our_text[max(0, where - 40) : where + 40],
                        "llama_server_near": None if where is None else slot_text[max(0, where - 40) : where + 40],
                        "head": our_text[:60],
                    }
                ),
                flush=True,
            )
    verifier.close()


if __name__ == "__main__":
    main()
