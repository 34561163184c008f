"""`ModelDrafter`: a small draft model proposes the chain (and, for draft trees, its runner-ups),
with llama.cpp's early stop (`--draft-p-min`: stop proposing when the draft's top probability
falls below p_min, after at least `n_min` tokens).

The draft model reads the context lazily: only when it is about to draft (`propose`) does it catch
up on what it has not seen (the prompt, plain steps, another drafter's steps), so an answer it
never drafts for (K 0, a K policy that finds it cannot win, n-gram steps) costs it nothing.

Reading ahead (`guess`, the hybrid's prompt lookup): a draft model's tokens come one pass each, but a
pass of a few more rows costs little more than one (the 0.5B draft on 2 cores: 31 ms one row, 38 two,
62 five, 93 nine, every row's logits). So where prompt lookup guesses what follows the chain so far,
the draft reads the guesses in the same pass as its newest token, and each row scores the position
after its guess: while the tokens it draws are the ones guessed, the next row is already there. Each
draft is drawn from the draft's row for exactly its context and reported with that row's q, so the
rule is as without it (with fakes the drafts are identical; llama.cpp's rows from a batch differ from
a single pass's in the last bits, as the verifier's do: tests/test_backend.py checks each draft is the
draft's argmax for its context there). Guesses it drew otherwise are dropped from its cache."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from .drafting import Drafts, DraftStep, Guess, Source, add_forced, common_prefix
from .model import Model
from .sampling import apply_penalties, mask_logits, sample_token, sparse_distribution

# A guess is read ahead while the chance that it and every guess before it are drawn is at least this:
# an extra row costs about a quarter of a draft pass (the figures above: 7.8 ms against 31), which a
# guess drawn saves whole.
READ_AHEAD_CHANCE = 0.25
# ... and at most this many a pass: a pass of 1 + n rows costs about 1 + n/4 passes of one, so a long
# guess drawn otherwise at its first token costs the most; each answer's drafter learns its chances
# afresh, and an editor's short completions, guessing 11-14 tokens from the file and drawing the first
# otherwise, paid a 140-160 ms pass for a 35 ms one (the F16 editor trace, 0.8-0.9x the code before).
READ_AHEAD_MAX = 4
GUESS_PRIOR_WEIGHT = 2.0  # guesses drawn: how much the evidence's word counts against what was seen
GUESS_MEMORY = 0.98  # each guess tested weighs the ones before by this (about the last 50 count)


class GuessChances:
    """How often the guesses read ahead are drawn, against what their evidence said (prompt lookup's
    chances, measured as the verifier's on the suite): each guess's chance is its evidence's times
    f = (drawn + w) / (expected + w), one factor for all (a text's guesses are right more or less often
    than the suite's, whatever their evidence; a factor per evidence would learn too slowly for one
    answer). A tool call's format in the prompt, which the answer lays out otherwise, was read 12
    times and drawn twice with the evidence alone."""

    def __init__(self) -> None:
        self.drawn = self.expected = 0.0  # decayed sums over the guesses tested: drawn, their chances

    def chance(self, prior: float) -> float:
        return min(1.0, prior * (self.drawn + GUESS_PRIOR_WEIGHT) / (self.expected + GUESS_PRIOR_WEIGHT))

    def observe(self, prior: float, drawn: bool) -> None:
        self.drawn = GUESS_MEMORY * self.drawn + drawn
        self.expected = GUESS_MEMORY * self.expected + prior


def _align(logits: np.ndarray, n_vocab: int) -> np.ndarray:
    """Fit draft logits to the verifier's vocabulary: extra draft entries are cut,
    missing ones get -inf (the draft never proposes a token the verifier lacks)."""
    if logits.shape[-1] >= n_vocab:
        return logits[..., :n_vocab]
    pad = np.full(logits.shape[:-1] + (n_vocab - logits.shape[-1],), -np.inf, dtype=logits.dtype)
    return np.concatenate([logits, pad], axis=-1)


class ModelDrafter:
    source: Source = "model"

    def __init__(self, model: Model, *, p_min: float = 0.0, n_min: int = 0, guess: Guess | None = None):
        self.model = model
        self.p_min = p_min
        self.n_min = n_min
        self.guess = guess  # what may follow a context, with each token's chance (read ahead: see above)
        self._agreed = 0  # the cache matched the context this far at the last sync
        # Guesses read after the newest drawn token: each with the row that scores what follows it and
        # the chance its evidence gave it.
        self._ahead: list[tuple[int, np.ndarray, float]] = []
        self.guess_chances = GuessChances()

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        # Nothing is read here: `propose` catches up. The cache may hold another answer's tokens
        # (an earlier turn, another conversation): the first sync keeps what it shares.
        self._agreed = 0

    def room(self, context_length: int) -> int:
        # It evaluates its pending tokens plus every draft but the last.
        return self.model.n_ctx - context_length + 1

    def next_source(self, context: list[int]) -> Source:
        return self.source

    def unread(self, context: list[int]) -> int:
        return max(0, len(context) - 1 - self._agreed_with(context))

    def propose(
        self,
        context: list[int],
        k: int,
        step: DraftStep,
    ) -> Drafts:
        drafts = Drafts(source=self.source)
        self.sync(context)  # the cache may hold tokens the context does not (see `prepare`)
        feed = context[self.model.n_past :]
        if len(feed) > 2:  # the prompt, plain steps, another drafter's: not a cost of drafting itself
            start = time.perf_counter()
            self.model.eval(feed[:-1], n_logits=0)
            drafts.catchup_seconds, drafts.catchup_tokens = time.perf_counter() - start, len(feed) - 1
            feed = feed[-1:]
        constraint = step.constraint  # a grammar: each draft masked by its state after the drafts before
        try:
            return self._chain(drafts, context, feed, k, step)
        finally:
            if constraint is not None:
                constraint.rollback(len(drafts.tokens))  # left as found: the verifier decides

    def _chain(self, drafts: Drafts, context: list[int], feed: list[int], k: int, step: DraftStep) -> Drafts:
        parent = -1  # the chain's last node (-1: the verifier's pending token)
        chain: list[int] = []  # the chain's tokens so far: with the context, what penalties count
        penalised = step.settings.penalties.active
        self._ahead = []
        while len(chain) < k:
            logits, read_ahead = self._row(context, chain, feed, k - len(chain) - 1, step)
            drafts.read_ahead += read_ahead
            if penalised:  # the very processing the verifier's row for this position gets
                logits = apply_penalties(logits, context + chain, step.settings)
            if step.constraint is not None:
                mask = step.constraint.allowed()
                drafts.masks.append(mask)
                logits = mask_logits(logits, mask)
            # A row with no finite entry (a grammar that allows only tokens this draft cannot score:
            # a hot vocabulary, a smaller vocabulary) ends the draft: q is undefined, nothing is proposed.
            if step.settings.greedy:
                token = int(np.argmax(logits))
                if logits[token] == -np.inf:
                    break
                total = np.exp(logits - logits[token]).sum()
                top_prob, draft_probs = float(1.0 / total), None
                if step.branch is not None:  # a scan of the vocabulary, only when trees may use it
                    top_two = np.argpartition(logits, -2)[-2:]
                    runner = int(top_two[0] if top_two[0] != token else top_two[1])
                    runner_up = float(np.exp(logits[runner] - logits[token]) / total)
            else:
                support, weights = sparse_distribution(logits, step.settings)
                if not support.size:
                    break
                token = int(support[sample_token(weights, step.rng)])
                top_prob = float(weights.max())
                runner_up = float(np.partition(weights, -2)[-2]) if len(weights) > 1 else 0.0
                draft_probs = np.zeros(step.n_vocab)
                draft_probs[support] = weights
            # Early stop: an unsure draft is not worth a verifier slot.
            if len(drafts.confidence) >= self.n_min and top_prob < self.p_min:
                break
            node = drafts.add(token, parent, draft_probs)
            drafts.confidence.append(top_prob)
            run = [token]  # what the model reads next: its token and what the grammar forces after it
            if step.constraint is not None:
                step.constraint.advance(token)
                if not self.model.is_eog(token):  # a key's name after its quote: free drafts, not the model's
                    run += add_forced(drafts, step, room=k - len(chain) - 1)
            if step.branch is not None and runner_up > 0.0 and step.branch(drafts.confidence, runner_up):
                # A sibling from the same distribution: greedy, the runner-up; sampling, a second
                # independent draw (a repeat of the first stays in the tree: the rule needs it).
                sibling = runner if step.settings.greedy else int(support[sample_token(weights, step.rng)])
                drafts.sides[drafts.add(sibling, parent, draft_probs)] = runner_up
            if (
                self.model.is_eog(token)
                or (step.last is not None and step.last(token))
                or (step.keep_drafting is not None and not step.keep_drafting(drafts.confidence))
            ):
                break
            feed, parent = run, node + len(run) - 1  # under a grammar, a chain: the forced tokens follow node
            chain += run
        if not drafts.sides:
            drafts.parents = []  # a chain
        return drafts

    def _row(
        self, context: list[int], chain: list[int], feed: list[int], room: int, step: DraftStep
    ) -> tuple[np.ndarray, bool]:
        """The draft's logits for what follows context + chain, whose tail `feed` the cache has not read,
        or has read ahead as a guess. A fresh pass reads the guesses for what follows, at most `room` (no
        grammar: its forced tokens join the feed). And whether it was read ahead (no pass of its own)."""
        if self._ahead:
            token, row, prior = self._ahead[0]
            drawn = feed == [token]
            self.guess_chances.observe(prior, drawn=drawn)
            if drawn:  # its row was read with the guess
                self._ahead.pop(0)
                return row, True
            # Drawn otherwise: the guesses after it leave the cache.
            self.model.rewind(self.model.n_past - len(self._ahead))
            self._ahead = []
        guessing = self.guess is not None and room > 0 and step.constraint is None
        guesses, priors = self._guesses(context + chain, room, step) if guessing else ([], [])
        rows = _align(self.model.eval(feed + guesses, n_logits=1 + len(guesses)), step.n_vocab)
        self._ahead = list(zip(guesses, rows[1:], priors))
        return rows[0], False

    def _guesses(self, sequence: list[int], room: int, step: DraftStep) -> tuple[list[int], list[float]]:
        """The guess's first tokens while the chance that all are drawn (each one's as `guess_chances`
        learned it) stays at least `READ_AHEAD_CHANCE`, with their evidence's chances; none past a
        token the answer would end with (`step.last`: no draft follows it)."""
        assert self.guess is not None
        tokens, priors = self.guess(sequence, min(room, READ_AHEAD_MAX))
        reach, n = 1.0, 0
        for token, prior in zip(tokens, priors):
            reach *= self.guess_chances.chance(prior)
            if reach < READ_AHEAD_CHANCE or (step.last is not None and step.last(token)):
                break
            n += 1
        return tokens[:n], priors[:n]

    def sync(self, context: list[int]) -> None:
        # Keep what the cache shares with the context (a sibling the verifier took replaces the
        # chain's token there), never the newest token: it rides in with the next proposal.
        self._agreed = min(self._agreed_with(context), len(context) - 1)
        self.model.rewind(self._agreed)

    def _agreed_with(self, context: list[int]) -> int:
        """How much of `context` the cache holds (it agreed up to the last sync: only what came since is compared)."""
        agreed = min(self._agreed, self.model.n_past)
        return agreed + common_prefix(self.model.cached[agreed:], context[agreed:])
