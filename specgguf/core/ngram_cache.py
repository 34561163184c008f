"""A session n-gram cache: which token followed each short token sequence seen so far, to draft from.

This is the Python counterpart of llama.cpp's `common/ngram-cache.{h,cpp}` (`common_ngram_cache_update`,
`common_ngram_cache_draft`, `..._save`/`..._load`), kept to what a session needs:

- `learn` counts, for every n-gram of min_n..max_n tokens in a sequence, the token that came next, for
  continuations at positions >= `start` (llama.cpp's `nnew`), so a growing sequence is fed incrementally.
- `lookup` drafts like `try_draft` on one cache: the longest known suffix n-gram proposes its most frequent
  follower, which is appended, and so on up to k tokens. llama.cpp falls back to shorter n-grams when the
  longest is unsure and also asks a minimum sample size; here the longest known n-gram decides, and an
  unsure one (best share below `min_share`) ends the draft. There is no static corpus cache.
- Unlike llama.cpp's cache, memory is bounded: past `max_entries` n-grams the least recently learned go.
- Files (ngram_store.py) are `.npz` read with `allow_pickle=False`, carry a format version and a key naming the
  tokenizer/pair they were learned with, are validated before use, and are replaced atomically.

Drafts are only proposals: the verifier's acceptance rule decides what is emitted, so a wrong draft costs
time, never correctness.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from . import ngram_store
from .drafting import common_prefix
from .ngram_store import FORMAT_VERSION, NgramCacheError

__all__ = ["NgramCacheError", "SessionNgrams"]

MAX_N = 16  # longest n-gram a cache may hold
MAX_TOKEN_ID = 2**31 - 1  # llama_token is an int32

# Texts a session remembers having counted (`learned_prefix`): a server's clients re-send their conversations
# (a chat's turns, an agent's transcript, an editor's file), several of them in turn.
RECENT_TEXTS = 8

# An n-gram followed by one token so far (most of them) is stored as the int count << 31 | token: no
# object per n-gram for the garbage collector to scan, and less memory. Others get a _Followers.
_TOKEN_BITS = 31
_TOKEN_MASK = (1 << _TOKEN_BITS) - 1
_ONE = 1 << _TOKEN_BITS


class _Followers:
    """The tokens that followed one n-gram, counted, and the best one (most frequent; ties: most recently counted)."""

    __slots__ = ("best", "best_count", "total", "counts")

    def __init__(self, counts: dict[int, int], best: int) -> None:
        self.counts = counts
        self.best = best
        self.best_count = counts[best]
        self.total = sum(counts.values())

    def add(self, token: int, count: int = 1) -> None:
        self.total += count
        new_count = self.counts.get(token, 0) + count
        self.counts[token] = new_count
        # Only the token just counted can overtake (or tie, and be more recent than) the best one.
        if new_count >= self.best_count:
            self.best = token
            self.best_count = new_count


_Entry = int | _Followers


class SessionNgrams:
    """Counts of the token that followed each n-gram (min_n..max_n tokens), drafting from the best-known one.

    Its calls hold a lock: the server's threads (serve --parallel) learn and look up at once."""

    def __init__(self, *, min_n: int = 2, max_n: int = 4, max_entries: int = 1_000_000, min_share: float = 0.5):
        """min_share: the most frequent follower's share of its n-gram's counts below which drafting stops.

        0.5, llama.cpp's lax threshold for n >= 2: draft a token only if it followed at least as often as all
        the others together. A lower share drafts more tokens the verifier mostly rejects, each costing a
        slot in the verifier's batch."""
        if not 1 <= min_n <= max_n <= MAX_N:
            raise ValueError(f"need 1 <= min_n <= max_n <= {MAX_N}, got min_n={min_n}, max_n={max_n}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        if not 0.0 < min_share <= 1.0:
            raise ValueError(f"min_share must be in (0, 1], got {min_share}")
        self.min_n = min_n
        self.max_n = max_n
        self.max_entries = max_entries
        self.min_share = min_share
        # n-gram -> followers, least recently learned first (keys of several lengths share the table).
        self._table: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        # The sequences learned lately and how far: the callers' own (a request's prompt, the engine's context,
        # which only grows, and is one entry as it does), held, not copied.
        self._recent: deque[tuple[Sequence[int], int]] = deque(maxlen=RECENT_TEXTS)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._table)

    def learn(self, tokens: Sequence[int], *, start: int = 0) -> None:
        """Count, for each n in min_n..max_n, the token that follows each n-gram in `tokens`, for
        continuations at positions >= start (so a caller can feed a growing sequence incrementally
        without counting anything twice)."""
        with self._lock:
            self._learn(tokens, start)
            self._remember(tokens)

    def _remember(self, tokens: Sequence[int]) -> None:
        """`tokens` counted to its end: one of the recent texts. The same sequence grown, or one that goes on
        from the newest (the engine's context after its prompt), takes that text's place: a request is one
        text, and RECENT_TEXTS are as many conversations."""
        for i, (text, _) in enumerate(self._recent):
            if text is tokens:
                del self._recent[i]
                break
        else:
            if self._recent:
                newest, n = self._recent[-1]
                if len(tokens) >= n and common_prefix(newest[:n], tokens) == n:
                    self._recent.pop()
        self._recent.append((tokens, len(tokens)))

    def learned_prefix(self, tokens: Sequence[int]) -> int:
        """How much of `tokens` is already counted: its longest common prefix with what the session counted
        of a recent text (RECENT_TEXTS of them). A request's prompt that repeats a conversation the session
        saw (each request's drafter is new; the session is the server's) is then counted from where it
        parts from it, not once more with every request."""
        with self._lock:
            return max((common_prefix(text[:n], tokens) for text, n in self._recent), default=0)

    def _learn(self, tokens: Sequence[int], start: int) -> None:
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        offset = max(start - self.max_n, 0)  # only the tail that new continuations can see
        window = [int(token) for token in tokens[offset:]]
        if not window:
            return
        if min(window) < 0 or max(window) > MAX_TOKEN_ID:
            raise ValueError(f"token ids must be in 0..{MAX_TOKEN_ID}")
        table = self._table
        min_n, max_n = self.min_n, self.max_n
        for i in range(max(start - offset, min_n), len(window)):
            follower = window[i]
            for n in range(min_n, min(max_n, i) + 1):
                ngram = tuple(window[i - n : i])
                entry = table.get(ngram)
                if entry is None:
                    table[ngram] = _ONE | follower
                    if len(table) > self.max_entries:
                        table.popitem(last=False)
                    continue
                table.move_to_end(ngram)
                if isinstance(entry, _Followers):
                    entry.add(follower)
                elif entry & _TOKEN_MASK == follower:
                    table[ngram] = entry + _ONE
                else:
                    only, only_count = entry & _TOKEN_MASK, entry >> _TOKEN_BITS
                    table[ngram] = _Followers({only: only_count, follower: 1}, follower if only_count == 1 else only)

    def lookup(self, context: Sequence[int], k: int) -> tuple[list[int], int]:
        """Up to k tokens continuing `context`, and the n of the n-gram that gave the first (0 if none).

        The longest suffix n-gram (max_n down to min_n) that the cache knows gives its most frequent next
        token (ties: the most recently learned); it is appended and the search repeats, up to k tokens.
        Drafting stops early when no n-gram matches or when that n-gram's best token has less than
        `min_share` of its counts."""
        with self._lock:
            return self._lookup(context, k)

    def _lookup(self, context: Sequence[int], k: int) -> tuple[list[int], int]:
        table = self._table
        tail = [int(token) for token in context[max(len(context) - self.max_n, 0) :]]
        drafted: list[int] = []
        first_n = 0
        while len(drafted) < k:
            entry = None
            n = min(self.max_n, len(tail))
            while n >= self.min_n:
                entry = table.get(tuple(tail[len(tail) - n :]))
                if entry is not None:
                    break
                n -= 1
            if entry is None:
                break
            if isinstance(entry, _Followers):
                if entry.best_count < self.min_share * entry.total:
                    break
                token = entry.best
            else:
                token = entry & _TOKEN_MASK  # the only follower: a share of 1
            if not drafted:
                first_n = n
            drafted.append(token)
            tail.append(token)
        return drafted, first_n

    def save(self, path: Path, *, key: str) -> None:
        """Write the cache to `path` (.npz), atomically (ngram_store.write).

        key: what the counts are only valid for (the tokenizer / model pair); `load` refuses any other."""
        ngram_store.write(path, self._to_arrays(key))

    @classmethod
    def load(
        cls,
        path: Path,
        *,
        key: str,
        min_n: int = 2,
        max_n: int = 4,
        max_entries: int = 1_000_000,
        min_share: float = 0.5,
        n_vocab: int | None = None,
    ) -> SessionNgrams:
        """A cache saved by `save` with the same key, with this configuration. Any problem with the file
        (missing, not an npz, truncated, corrupt, another format version or key, n-grams outside min_n..max_n)
        raises NgramCacheError, and so do token ids >= n_vocab (the model's vocabulary, when given) and a file
        of more than ngram_store.MAX_FILE_ENTRIES. A file with more than max_entries n-grams keeps its newest ones."""
        cache = cls(min_n=min_n, max_n=max_n, max_entries=max_entries, min_share=min_share)
        problem = cache._fill(ngram_store.read(path, key=key, min_n=min_n, max_n=max_n, n_vocab=n_vocab))
        if problem:
            raise ngram_store.rejected(path, problem)
        return cache

    def _to_arrays(self, key: str) -> dict[str, np.ndarray]:
        lengths: list[int] = []
        ngram_tokens: list[int] = []
        n_followers: list[int] = []
        follower_tokens: list[int] = []
        follower_counts: list[int] = []
        for ngram, entry in self._table.items():
            lengths.append(len(ngram))
            ngram_tokens.extend(ngram)
            if isinstance(entry, _Followers):
                n_followers.append(len(entry.counts))
                for token, count in entry.counts.items():
                    if token != entry.best:
                        follower_tokens.append(token)
                        follower_counts.append(count)
                # The best one last: `load` takes the last of the most frequent as the best.
                follower_tokens.append(entry.best)
                follower_counts.append(entry.best_count)
            else:
                n_followers.append(1)
                follower_tokens.append(entry & _TOKEN_MASK)
                follower_counts.append(entry >> _TOKEN_BITS)
        return {
            "version": np.array(FORMAT_VERSION, dtype=np.int64),
            "key": np.array(key, dtype=np.str_),
            "ngram_lengths": np.array(lengths, dtype=np.int8),
            "ngram_tokens": np.array(ngram_tokens, dtype=np.int32),
            "n_followers": np.array(n_followers, dtype=np.int32),
            "follower_tokens": np.array(follower_tokens, dtype=np.int32),
            "follower_counts": np.array(follower_counts, dtype=np.int64),
        }

    def _fill(self, arrays: dict[str, np.ndarray]) -> str | None:
        """Rebuild the table from checked arrays, oldest first; a reason if they hold duplicates."""
        lengths = arrays["ngram_lengths"].tolist()
        ngram_tokens = arrays["ngram_tokens"].tolist()
        n_followers = arrays["n_followers"].tolist()
        follower_tokens = arrays["follower_tokens"].tolist()
        follower_counts = arrays["follower_counts"].tolist()
        skip = max(len(lengths) - self.max_entries, 0)  # the oldest ones that do not fit
        table = self._table
        token_at = follower_at = 0
        for index, (length, n_following) in enumerate(zip(lengths, n_followers)):
            ngram = tuple(ngram_tokens[token_at : token_at + length])
            token_at += length
            if n_following == 1:
                entry: _Entry = follower_counts[follower_at] << _TOKEN_BITS | follower_tokens[follower_at]
            else:
                counts = dict(
                    zip(
                        follower_tokens[follower_at : follower_at + n_following],
                        follower_counts[follower_at : follower_at + n_following],
                    )
                )
                if len(counts) != n_following:
                    return "an n-gram lists the same follower twice"
                best_count = max(counts.values())
                best = [token for token, count in counts.items() if count == best_count][-1]
                entry = _Followers(counts, best)
            follower_at += n_following
            if index < skip:
                continue
            if ngram in table:
                return "an n-gram is stored twice"
            table[ngram] = entry
        return None
