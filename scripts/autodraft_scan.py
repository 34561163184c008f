"""How long `-m` alone takes to look through the local models for a draft: the `gguf` package's reader
against specgguf's header walk on one file, then a scan of N files with a cold and a warm summary index.

    PYTHONPATH=. python scripts/autodraft_scan.py [GGUF] [--copies 50]

GGUF defaults to the default pair's draft (assembled from its PyPI packages if installed). The copies are
hard links in a temporary LM Studio folder (no disk space); each is a separate file to the index.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def _timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", type=Path)
    parser.add_argument("--copies", type=int, default=50)
    args = parser.parse_args()
    if args.gguf is None:
        from specgguf.files.registry import load_registry
        from specgguf.files.resolve import local_model_path

        args.gguf = local_model_path(load_registry().get("qwen2.5-coder-1.5b").draft)
    from gguf import GGUFReader

    from specgguf.drafts.found import local_pairs
    from specgguf.files.gguf_header import summarize

    def library() -> None:
        field = GGUFReader(args.gguf).fields["tokenizer.ggml.tokens"]
        _ = [bytes(field.parts[i]) for i in field.data]

    ours, theirs = _timed(lambda: summarize(args.gguf)), _timed(library)
    print(
        f"one file ({args.gguf.name}): gguf.GGUFReader {theirs:.3f} s, specgguf's header walk {ours:.3f} s:"
        f" {theirs / ours:.1f}x"
    )
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        os.environ.update(
            SPECGGUF_CACHE=str(root / "cache"),
            SPECGGUF_LMSTUDIO_MODELS=str(root / "lmstudio"),
            OLLAMA_MODELS=str(root / "ollama"),
            HF_HOME=str(root / "hf"),
        )
        for n in range(args.copies):
            target = root / "lmstudio" / "scan" / f"copy-{n}" / args.gguf.name
            target.parent.mkdir(parents=True)
            os.link(args.gguf, target)
        cold, warm = _timed(local_pairs), _timed(local_pairs)
        print(
            f"{args.copies} files: first scan {cold:.3f} s (headers read), again {warm:.3f} s (index):"
            f" {cold / warm:.1f}x"
        )


if __name__ == "__main__":
    main()
