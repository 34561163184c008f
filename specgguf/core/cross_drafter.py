"""`CrossVocabDrafter`: a draft model with another vocabulary drafts for the verifier through text
(Timor et al., ICML 2025, arXiv 2502.05202, "Token-Level Intersection"; vLLM #38174; Hugging Face
transformers' universal assisted generation).

The draft reads the conversation as text: the verifier's context is turned into bytes (each verifier
token's piece) and tokenized by the draft's own tokenizer. It proposes only tokens of the intersection
(core/vocab_map.py: draft tokens with a verifier token of the same bytes): its processed row is masked
to the intersection and renormalised, then carried over to verifier ids. After each step it catches up
through text again, the verifier's resampled and bonus tokens included, which may lie outside the
intersection: they are bytes like any other.

Why the output is still exactly the verifier's: the acceptance rule (accept x with probability
min(1, p(x)/q(x)), else draw from normalize(max(0, p - q))) gives the verifier's p for ANY draft
distribution q over the verifier's ids, provided x is drawn from the q that is reported. Here q is
a proper distribution over verifier ids: the masked, renormalised draft row, each draft id's mass
added to its verifier id (two draft ids with the same bytes add up), zero outside the intersection;
the proposed token is drawn from that very row. Tokens the draft cannot propose keep their p: the
residual max(0, p - q) = p there, so the verifier writes them on rejections and bonus steps. Cutting
p to the intersection, or reporting q without renormalising it, would break this (tests/
test_cross_vocab_laws.py plants both). Greedy: the verifier's argmax decides every token, whatever
the draft proposes. How the draft tokenizes the text affects only how often it is right.

The string-level mode (string_drafter.py: the draft's own text, re-encoded by the verifier, proposed as
point masses) shares this drafter's reading of the text (`read`, `catch_up`) and `VerifierText` below.

Token boundaries move: text read as `a` then `b` may be one draft token `ab`. The draft keeps its
tokens only up to a window of `window` tokens before the end of the text the verifier still agrees
with, re-tokenizes the text from there, and keeps its KV cache up to the longest common token prefix.
Bytes at the end that are not yet a whole UTF-8 character wait for the next step.

With the rest: a grammar's masks (over verifier ids) cut the draft's candidates to what they allow;
penalties are left out of q (exact all the same: any q is); it drafts chains, never trees (it asks
no `branch`); the draft file is used as given (no re-quantized or hot-vocabulary variant: prepare.py).
Growing the draft's last token with the first draft (`\n` then `    ` is the draft's own `\n    `,
token healing) was tried and measured no better on SmolLM2 -> Gemma 3: not kept.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from typing import Literal

import numpy as np

from .drafting import Drafts, DraftStep, Source, common_prefix
from .model import Model
from .sampling import SamplingSettings, sample_token, sparse_distribution
from .vocab_map import VocabMap

CrossMode = Literal["tokens", "string"]  # as --cross-mode names them
CROSS_MODES: tuple[CrossMode, ...] = ("tokens", "string")
CROSS_MODE_NAMES: dict[CrossMode, str] = {"tokens": "shared tokens", "string": "string-level"}  # in messages
# The default, by measurement (docs/pairs.md): on the F16 verifier, SmolLM2-135M and Gemma-3-270M drafting
# in their own text were kept 68-83% of the time on code (1.48-1.99x plain decoding) against 22-28% for
# the shared tokens, and never slower than them on code, prose or an edit.
DEFAULT_CROSS_MODE: CrossMode = "string"
# What --cross-mode takes: a mode, or "auto" (the default): the faster of the two as measured here for
# the pair, once, on the calibration prompts (cross_search.choose_mode); DEFAULT_CROSS_MODE until measured.
CrossModeChoice = Literal["auto", "tokens", "string"]
AUTO_CROSS_MODE: CrossModeChoice = "auto"
CROSS_MODE_CHOICES: tuple[CrossModeChoice, ...] = (AUTO_CROSS_MODE, *CROSS_MODES)


def unmeasured_mode(choice: CrossModeChoice) -> CrossMode:
    """The mode a choice drafts in before (or without) measuring: "auto" starts from the default."""
    return next((mode for mode in CROSS_MODES if mode == choice), DEFAULT_CROSS_MODE)


Tokenize = Callable[[bytes], list[int]]  # the draft's tokens for this text: no BOS, no added prefix space


def complete_utf8(data: bytes | bytearray) -> int:
    """The length of the longest prefix that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return len(data)
        if byte >= 0xC0:  # a lead byte: whole if its sequence is
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)


def intersection_distribution(
    logits: np.ndarray, shared: np.ndarray, settings: SamplingSettings
) -> tuple[np.ndarray, np.ndarray]:
    """The draft's processed distribution over draft ids, its row masked to the intersection first (so
    the result is renormalised over it): (support, weights)."""
    return sparse_distribution(np.where(shared, logits, -np.inf), settings)


class VerifierText:
    """The verifier's side of the text round trip: its tokenizer (bytes -> tokens, no BOS, special
    tokens' texts read as those tokens) and the bytes of each of its tokens."""

    def __init__(self, tokenize: Tokenize, pieces: Sequence[bytes]):
        self.tokenize, self.pieces = tokenize, pieces

    @cached_property
    def adds_space(self) -> bool:
        """Whether its tokenizer writes a space before the text (SentencePiece's space prefix;
        string_drafter.reencode)."""
        probe = next((piece for piece in self.pieces if piece.isalpha()), b"a")  # a word it has
        return b"".join(self.pieces[token] for token in self.tokenize(probe)) == b" " + probe

    @cached_property
    def prefixes(self) -> frozenset[bytes]:
        """The token texts that are a strict prefix of another token's (built once, on first need). In
        sorted order a text's successor starts with it whenever any longer text does."""
        texts = sorted(set(self.pieces))
        return frozenset(text for text, after in zip(texts, texts[1:]) if text and after.startswith(text))

    def index(self) -> None:
        """Build what `could_merge` and `string_drafter.reencode` read, now rather than on first need."""
        _ = self.adds_space, self.prefixes

    def could_merge(self, token: int) -> bool:
        """Whether a longer token starts with this token's bytes (text that follows may merge into it)."""
        return self.pieces[token] in self.prefixes


@dataclass(frozen=True)
class CrossVocab:
    """What a draft model of another vocabulary drafts with besides itself (drafts/cross_vocab.py makes it
    for a loaded pair; the drafter table's `cross` row takes it from DraftSettings)."""

    vocab_map: VocabMap
    verifier_pieces: Sequence[bytes]  # what the draft reads for each verifier token
    draft_pieces: Sequence[bytes]  # the bytes of each draft token
    tokenize: Tokenize
    bos: int | None = None  # the draft's first token, before the text
    # How it proposes: "tokens", tokens of the intersection (here); "string", its own text re-encoded
    # by the verifier's tokenizer (string_drafter.py, which needs `verifier_text`).
    mode: CrossMode = DEFAULT_CROSS_MODE
    verifier_text: VerifierText | None = None


class CrossVocabDrafter:
    source: Source = "model"

    def __init__(self, model: Model, cross: CrossVocab, *, window: int = 4, p_min: float = 0.0, n_min: int = 0):
        self.model, self.map, self.tokenize = model, cross.vocab_map, cross.tokenize
        self.verifier_pieces, self.draft_pieces = cross.verifier_pieces, cross.draft_pieces
        self.window, self.p_min, self.n_min = window, p_min, n_min
        self._head = [] if cross.bos is None else [cross.bos]  # tokens before the text (BOS), never re-read
        self._seen: list[int] = []  # the verifier tokens read so far ...
        self._seen_ends: list[int] = []  # ... where each one's bytes end in the text
        self._text = bytearray()
        self.tokens: list[int] = list(self._head)  # the draft's tokens for the text read (whole characters)
        self._ends: list[int] = [0] * len(self._head)  # where each draft token ends in the text

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        pass  # `propose` catches up on what it has not read, keeping what the text shares

    def room(self, context_length: int) -> int:
        # An estimate: `propose` checks the draft's own length once it has read the text.
        return self.model.n_ctx - context_length + 1

    def next_source(self, context: list[int]) -> Source:
        return self.source

    def unread(self, context: list[int]) -> int:
        """The context's tokens whose text it has not read (the engine's reading rule defers a long read;
        the catch-up that reads them is timed per verifier token, as a draft sharing the vocabulary's is)."""
        return max(0, len(context) - 1 - common_prefix(self._seen, context))

    def sync(self, context: list[int]) -> None:
        pass  # the next `propose` compares the text read with the context, by token then by bytes

    def read(self, context: Sequence[int]) -> None:
        """Bring `tokens` to the draft's tokenization of the context's text (see the module docstring)."""
        n_same = common_prefix(self._seen, context)
        kept_bytes = self._seen_ends[n_same - 1] if n_same else 0
        new_ends = accumulate((len(self.verifier_pieces[token]) for token in context[n_same:]), initial=kept_bytes)
        del self._text[kept_bytes:]
        self._text += b"".join(self.verifier_pieces[token] for token in context[n_same:])
        self._seen = list(context)
        self._seen_ends = self._seen_ends[:n_same] + list(new_ends)[1:]
        # Draft tokens wholly inside the text still agreed on, less a window whose boundaries may move.
        n_keep = max(len(self._head), bisect.bisect_right(self._ends, kept_bytes) - self.window)
        start = self._ends[n_keep - 1] if n_keep else 0
        end = complete_utf8(self._text)
        tail = self.tokenize(bytes(self._text[start:end])) if end > start else []
        self.tokens = self.tokens[:n_keep] + tail
        self._ends = (
            self._ends[:n_keep] + list(accumulate((len(self.draft_pieces[t]) for t in tail), initial=start))[1:]
        )

    def catch_up(self, context: Sequence[int], k: int, drafts: Drafts) -> tuple[list[int], int]:
        """Read the context's text, bring the draft's cache to all of its tokens but the last: (the token
        to feed next, as a list; the drafts the context leaves room for). Nothing to feed: ([], 0).
        Shared with the string-level mode (string_drafter.py)."""
        start = time.perf_counter()
        self.read(context)
        n_reused = min(common_prefix(self.model.cached, self.tokens), len(self.tokens) - 1)
        self.model.rewind(n_reused)
        feed = self.tokens[n_reused:]
        k = min(k, self.model.n_ctx - len(self.tokens) + 1)
        if not feed or k <= 0:
            return [], 0
        if len(feed) > 1:  # the prompt, the verifier's tokens: not a cost of drafting itself
            self.model.eval(feed[:-1], n_logits=0)
            drafts.catchup_tokens = len(feed) - 1
            feed = feed[-1:]
        drafts.catchup_seconds = time.perf_counter() - start
        return feed, k

    def propose(self, context: list[int], k: int, step: DraftStep) -> Drafts:
        drafts = Drafts(source=self.source)
        feed, k = self.catch_up(context, k, drafts)
        if not feed:
            return drafts
        constraint = step.constraint  # a grammar: masks over verifier ids, carried to draft ids
        try:
            return self._chain(drafts, feed, k, step)
        finally:
            if constraint is not None:
                constraint.rollback(len(drafts.tokens))

    def _chain(self, drafts: Drafts, feed: list[int], k: int, step: DraftStep) -> Drafts:
        to_verifier, n_draft = self.map.to_verifier, len(self.map.to_verifier)
        for _ in range(k):
            logits = self.model.eval(feed, n_logits=1)[0][:n_draft]
            shared = self.map.shared
            if step.constraint is not None:
                mask = step.constraint.allowed()
                drafts.masks.append(mask)
                shared = shared & mask[to_verifier]  # -1 entries are not shared anyway
            if step.settings.greedy:
                masked = np.where(shared, logits, -np.inf)
                token = int(np.argmax(masked))
                if masked[token] == -np.inf:
                    break
                top_prob, draft_probs = float(1.0 / np.exp(masked - masked[token]).sum()), None
            else:
                support, weights = intersection_distribution(logits, shared, step.settings)
                if not support.size:
                    break
                token = int(support[sample_token(weights, step.rng)])
                top_prob = float(weights.max())
                # q over verifier ids: each draft id's mass on its verifier id, zero elsewhere.
                draft_probs = np.zeros(step.n_vocab)
                np.add.at(draft_probs, to_verifier[support], weights)
            if len(drafts.confidence) >= self.n_min and top_prob < self.p_min:
                break
            verifier_token = int(to_verifier[token])
            drafts.add(verifier_token, len(drafts.tokens) - 1, draft_probs)
            drafts.confidence.append(top_prob)
            if step.constraint is not None:
                step.constraint.advance(verifier_token)
            if self.model.is_eog(token) or (
                step.keep_drafting is not None and not step.keep_drafting(drafts.confidence)
            ):
                break
            feed = [token]
        drafts.parents = []  # a chain
        return drafts
