"""`StringDrafter`: the string-level mode of the cross-vocabulary drafter (Timor et al., ICML 2025,
arXiv 2502.05202, "String-Level Exact Match"; Hugging Face transformers' universal assisted generation).

The draft writes up to K of its OWN tokens, unmasked: its most likely token at every temperature (a
point mass is kept with probability p(x), highest at the verifier's mode, which the draft's mode guesses;
sampling from the draft instead kept fewer: docs/pairs.md). Their bytes are re-encoded by the verifier's
tokenizer in context, and the verifier tokens that come back are proposed, each as a point mass. One step:

    text   = the bytes of the draft's tokens, less the part of a character the context already holds
             (a UTF-8 character split across tokens: core/cross_drafter.complete_utf8), cut at the
             last whole character
    window = the last `window` verifier tokens of the context (after its last token with no bytes, a BOS)
    tokens = verifier_tokenize(bytes(window) + text)
    tokens[:len(window)] != window          -> draft nothing (the window's boundaries moved: the new text
                                               would merge into the context, which is already written)
    proposed = tokens[len(window):]; their bytes must be `text`, else nothing
    drop the last proposed token when it could still merge with what follows: `hold="prefix"` when some
                                               longer verifier token starts with its bytes, `"always"`
                                               always; never after the draft's end-of-generation token

Re-encoding the text alone (no window) would split it at a boundary the context does not have: after a
context ending in `a`, the draft's `b` re-encodes alone to `b`, where the verifier's tokenizer writes `ab`
(the proposal `b` is text the verifier almost never writes that way); and a tokenizer that puts a space
before the first word (SentencePiece's space prefix, `VerifierText.adds_space`) would re-encode `b` as
` b`, another text. tests/test_string_laws.py plants the first, tests/test_string_drafter.py checks the
second. Only the window and the new text are re-encoded, never the whole context: the text round trip's
cost (`Drafts.text_seconds`, the engine's `StepEvent.draft_text_seconds`) stays small.

Why the output is still exactly the verifier's: each proposed token x is deterministic given the
context (as it would be given the draft's own draws, were it to sample: the verifier's draw plays no
part in choosing it), so it is verified as a point mass, q = one-hot(x), as n-gram drafts are
(drafting.fixed_drafts). core/sampling.accept_tree with q one-hot accepts x with probability
min(1, p(x)/q(x)) = p(x), and on rejection draws from normalize(max(0, p - q)) = p with x removed,
renormalised: the emitted token y has P(y) = p(x)·[y = x] + (1 - p(x))·p(y)/(1 - p(x))·[y != x] = p(y) (the
test: test_string_laws.test_the_engines_rule_with_a_one_hot_q_is_p_then_p_without_x). The
draft's own probability of its tokens plays no part: using it as q (min(1, p(x)/q_draft(x))) would
bias the law (planted in tests/test_string_laws.py, with a residual that keeps x). Greedy: the
verifier's argmax decides every token. p is the verifier's processed, masked distribution, so grammar
masks, penalties and logit bias compose; under a grammar the engine cuts the proposal at its first
forbidden token (engine._propose).

Byte-fallback tokens and SentencePiece spaces: both vocabularies are read as bytes (core/vocab_map.py:
`<0xNN>` is the byte NN, `▁` a space, GPT-2's byte table undone), so a draft's byte token or `▁word`
is text like any other. The draft reads the verifier's context and catches up after each step
through text exactly as in the intersection mode (CrossVocabDrafter.catch_up).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from itertools import accumulate
from typing import Literal

import numpy as np

from .cross_drafter import CrossVocab, CrossVocabDrafter, VerifierText, complete_utf8
from .drafting import Drafts, DraftStep, fixed_drafts
from .model import Model
from .sampling import sparse_distribution

HoldBack = Literal["prefix", "always"]  # when the last re-encoded token waits for the next step


def reencode(
    verifier: VerifierText, context: Sequence[int], text: bytes, *, window: int
) -> tuple[list[int], list[int]] | None:
    """The verifier's tokens for `text` written after `context`, re-encoded together with the
    context's last `window` tokens: (window, new tokens), or None where the window does not come back
    unchanged or the new tokens are not exactly `text`."""
    start = max(0, len(context) - window)
    empty = [at for at in range(start, len(context)) if not verifier.pieces[context[at]]]
    start = empty[-1] + 1 if empty else start  # a BOS has no bytes: the window starts after it
    held = list(context[start:])
    window_bytes = b"".join(verifier.pieces[token] for token in held)
    if verifier.adds_space:  # its tokenizer writes the window's first space itself
        if held and not window_bytes.startswith(b" "):
            return None
        window_bytes = window_bytes[1:] if held else window_bytes
    tokens = verifier.tokenize(window_bytes + text)
    if tokens[: len(held)] != held:
        return None
    new = tokens[len(held) :]
    if b"".join(verifier.pieces[token] for token in new) != text:
        return None
    return held, new


class StringDrafter(CrossVocabDrafter):
    """Drafts the draft's own text, re-encoded by the verifier (see the module docstring)."""

    def __init__(
        self,
        model: Model,
        cross: CrossVocab,
        verifier: VerifierText,
        *,
        window: int = 4,
        context_window: int = 4,
        hold: HoldBack = "prefix",
        p_min: float = 0.0,
        n_min: int = 0,
    ):
        super().__init__(model, cross, window=window, p_min=p_min, n_min=n_min)
        self.verifier, self.context_window, self.hold = verifier, context_window, hold
        verifier.index()  # once per pair (a quarter second for 151k tokens), off the first step's clock

    def propose(self, context: list[int], k: int, step: DraftStep) -> Drafts:
        drafts = Drafts(source=self.source)
        feed, k = self.catch_up(context, k, drafts)
        if not feed:
            return drafts
        written, confidence, ended = self.write(feed, k, step)
        start = time.perf_counter()
        tokens, token_confidence = self.text_tokens(context, written, confidence, ended)
        drafts.text_seconds = time.perf_counter() - start
        proposed = fixed_drafts(tokens[:k], step, self.source)  # point masses, q(x) = 1: a chain
        drafts.tokens, drafts.probs, drafts.confidence = proposed.tokens, proposed.probs, token_confidence[:k]
        return drafts

    def write(self, feed: list[int], k: int, step: DraftStep) -> tuple[list[int], list[float], bool]:
        """Up to k of the draft's own most likely tokens, unmasked, at any temperature: (tokens, each
        one's probability in its processed distribution, whether it wrote its end of generation). A point
        mass x is kept with probability p(x), so the draft's mode, its best guess of the verifier's, is
        kept more often than a draw from it would be (E_q[p(x)] <= p(mode) where q and p agree)."""
        written: list[int] = []
        confidence: list[float] = []
        n_draft = len(self.draft_pieces)
        for _ in range(k):
            logits = self.model.eval(feed, n_logits=1)[0][:n_draft]
            if step.settings.greedy:
                token = int(np.argmax(logits))
                top_prob = float(1.0 / np.exp(logits - logits[token]).sum())
            else:  # its most likely token, with its processed probability (the candidates come sorted)
                support, weights = sparse_distribution(logits, step.settings)
                if not support.size:
                    break
                token, top_prob = int(support[0]), float(weights[0])
            if len(confidence) >= self.n_min and top_prob < self.p_min:
                break
            if self.model.is_eog(token):
                return written, confidence, True
            written.append(token)
            confidence.append(top_prob)
            if step.keep_drafting is not None and not step.keep_drafting(confidence):
                break
            feed = [token]
        return written, confidence, False

    def text_tokens(
        self, context: Sequence[int], written: list[int], confidence: list[float], ended: bool
    ) -> tuple[list[int], list[float]]:
        """The verifier tokens for the draft's written text after `context`, each with the lowest
        confidence of the draft tokens its bytes overlap."""
        pending = bytes(self._text[complete_utf8(self._text) :])  # a character's start the context holds
        data = b"".join(self.draft_pieces[token] for token in written)
        if not data.startswith(pending):
            return [], []
        text = data[len(pending) : complete_utf8(data)]
        if not text:
            return [], []
        found = reencode(self.verifier, context, text, window=self.context_window)
        if found is None:
            return [], []
        tokens = found[1]
        text_ended = ended and len(text) == len(data) - len(pending)  # nothing can follow it
        if tokens and not text_ended and (self.hold == "always" or self.verifier.could_merge(tokens[-1])):
            tokens = tokens[:-1]
        draft_ends = list(accumulate(len(self.draft_pieces[token]) for token in written))
        chances, at = [], len(pending)
        for token in tokens:
            first = bisect.bisect_right(draft_ends, at)
            at += len(self.verifier.pieces[token])
            last = bisect.bisect_left(draft_ends, at)
            chances.append(min(confidence[first : last + 1]))
        return tokens, chances
