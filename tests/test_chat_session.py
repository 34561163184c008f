"""Chat turns on real tiny GGUF models: each turn evaluates only its new tokens, in both models."""

from __future__ import annotations

import numpy as np
import pytest

from specgguf.cli.chat_session import ChatSession
from specgguf.conversation import Message
from specgguf.core import drafting as reading
from specgguf.core.drafting import common_prefix
from specgguf.core.engine import FixedK, speculate
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.sampling import SamplingSettings
from specgguf.errors import ContextFullError
from specgguf.llama.model import LlamaModel

QUESTIONS = [
    "hello the cat",
    "and the dog?",
    "what is the time",
    "tell me a long story about the sea",
    "why",
    "the end",
]


class CountingModel:
    """A real model that records each eval call as (first position, tokens, n_logits), and every
    token sequence whose last token it computed (twice for the same sequence means wasted work)."""

    def __init__(self, model: LlamaModel):
        self.model = model
        self.calls: list[tuple[int, list[int], int]] = []
        self.computed: set[int] = set()
        self.recomputed = 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def _count(self, tokens, n_logits):
        self.calls.append((self.model.n_past, list(tokens), n_logits))
        sequence = list(self.model.cached)
        for token in tokens:
            sequence.append(token)
            key = hash(tuple(sequence))
            self.recomputed += key in self.computed
            self.computed.add(key)

    def eval(self, tokens, *, n_logits):
        self._count(tokens, n_logits)
        return self.model.eval(tokens, n_logits=n_logits)

    def eval_tree(self, tokens, parents, *, n_logits):
        assert list(parents) == list(range(-1, len(tokens) - 1))  # a fixed K drafts chains
        self._count(tokens, n_logits)
        return self.model.eval_tree(tokens, parents, n_logits=n_logits)

    def positions_below(self, end: int) -> int:
        """How many prompt positions (< end) it evaluated since the calls were cleared."""
        return sum(max(0, min(end, start + len(tokens)) - start) for start, tokens, _ in self.calls)

    def first_position(self) -> int:
        return min(start for start, tokens, _ in self.calls if tokens)


def make_session(verifier_path, draft_path, *, n_ctx=2048, k=3, max_tokens=24, system=None):
    verifier = CountingModel(LlamaModel(verifier_path, n_ctx=n_ctx, n_threads=1))
    draft = CountingModel(LlamaModel(draft_path, n_ctx=n_ctx, n_threads=1))
    return ChatSession(
        verifier=verifier,
        draft=draft,
        drafter=ModelDrafter(draft),
        policy=FixedK(k),
        system=system,
        max_tokens=max_tokens,
        settings=SamplingSettings(temperature=0),
        seed=1,
    )


def answer(session: ChatSession, question: str, *, stop_after: int | None = None):
    reply = session.ask(question)
    for n_events, _ in enumerate(reply, start=1):
        if stop_after is not None and n_events >= stop_after:
            break
    return reply.finish(interrupted=stop_after is not None), reply.prompt_tokens


def test_a_draft_that_left_a_long_prompt_unread_reports_none_of_it_read(tiny_verifier, tiny_draft, monkeypatch):
    """The reading rule (core/drafting.py) may leave a long prompt unread by the draft for all of a short
    answer: the turn reports what each model really read, not what it lacked."""
    one_second = classmethod(lambda cls, seconds, n, measured=None: cls(1.0))  # a token
    monkeypatch.setattr(reading.Reading, "after_prefill", one_second)
    session = make_session(tiny_verifier, tiny_draft, system="you are a tiny model", max_tokens=4)
    turn, prompt = answer(session, QUESTIONS[0])
    assert len(prompt) > reading.LONG_READ  # long enough to wait for
    assert turn.n_evaluated == {"verifier": len(prompt), "draft": 0}
    assert session.draft.positions_below(len(prompt)) == 0
    monkeypatch.undo()
    monkeypatch.setattr(reading, "LONG_READ", 10**6)  # the next turn's draft reads at once what it lacks: all of it
    turn, prompt = answer(session, QUESTIONS[1])
    assert turn.n_evaluated["draft"] == session.draft.positions_below(len(prompt)) == len(prompt)


def test_each_turn_evaluates_only_what_the_caches_do_not_hold_in_both_models(tiny_verifier, tiny_draft, monkeypatch):
    # The draft reads every prompt at once: when it starts reading a long one depends on the machine's
    # timings (core/drafting.py; the test below covers a prompt it never reads).
    monkeypatch.setattr(reading, "LONG_READ", 10**6)
    session = make_session(tiny_verifier, tiny_draft, system="you are a tiny model")
    models = {"verifier": session.verifier, "draft": session.draft}
    previous: list[int] = []  # the previous turn's prompt
    history: list[int] = []  # ... plus its answer
    for number, question in enumerate(QUESTIONS[:5], start=1):
        for model in models.values():
            model.calls.clear()
        turn, prompt = answer(session, question)
        # The prompt is the conversation's text tokenized fresh: it repeats the earlier prompt, and the
        # earlier answer as far as its generated tokens are what its text tokenizes to (the tiny
        # model's random answers often are not; a real model's mostly are).
        shared = common_prefix(history, prompt)
        assert shared >= len(previous)
        n_new = len(prompt) - shared
        for name, model in models.items():
            evaluated = model.positions_below(len(prompt))
            assert evaluated == turn.n_evaluated[name]  # the stats line reports what really happened
            assert model.recomputed == 0, name  # nothing the cache held is ever evaluated again
            if number == 1:
                assert evaluated == len(prompt)
            else:
                assert model.first_position() >= shared - 4
        # The verifier evaluates the new tokens, plus the answer's last token when it stopped at -n
        # (the draft may also catch up on answer tokens it skipped, e.g. in steps without drafts).
        assert number == 1 or n_new <= turn.n_evaluated["verifier"] <= n_new + 1
        assert number < 5 or shared > 3 * n_new  # so "only the new tokens" says something
        previous, history = prompt, prompt + turn.answer_tokens
    # The control: with the caches forgotten, the same kind of turn evaluates everything.
    session.forget_caches()
    for model in models.values():
        model.calls.clear()
    turn, prompt = answer(session, QUESTIONS[5])
    assert turn.n_evaluated == {"verifier": len(prompt), "draft": len(prompt)}
    assert session.verifier.positions_below(len(prompt)) == len(prompt)
    assert session.verifier.recomputed >= common_prefix(history, prompt) - 1  # what was cached, again


def test_an_interrupted_answer_stays_in_the_history_and_the_next_turn_matches_a_fresh_start(tiny_verifier, tiny_draft):
    session = make_session(tiny_verifier, tiny_draft)
    answer(session, QUESTIONS[0])
    partial, _ = answer(session, QUESTIONS[1], stop_after=2)
    assert partial.stop == "interrupted" and 0 < len(partial.answer_tokens) < session.max_tokens
    assert partial.answer and session.transcript[-1] is partial
    # The engine left each cache at a prefix of the conversation plus (the draft) stray drafts:
    # the next turn must rewind them, not trust them.
    session.draft.model.eval([5, 6, 7], n_logits=0)  # stray tokens beyond the history
    after, prompt = answer(session, QUESTIONS[2])
    assert after.n_evaluated["verifier"] <= len(prompt) - len(session.transcript[0].answer_tokens)
    # A fresh session fed the same history evaluates it all and gives the same greedy answer.
    fresh = make_session(tiny_verifier, tiny_draft)
    fresh.transcript = [turn for turn in session.transcript[:2]]
    again, fresh_prompt = answer(fresh, QUESTIONS[2])
    assert fresh_prompt == prompt and again.n_evaluated["verifier"] == len(prompt)
    assert again.answer_tokens == after.answer_tokens


def test_a_turns_prompt_is_the_conversation_text_tokenized_fresh(tiny_verifier, tiny_draft):
    # What `specgguf serve` reads for the same messages (and llama-server): not the tokens the earlier
    # answers came out as, which the tiny model's random answers rarely are their text's own.
    session = make_session(tiny_verifier, tiny_draft, system="you are a tiny model")
    for question in QUESTIONS[:2]:
        answer(session, question)
    turn, prompt = answer(session, QUESTIONS[2])
    messages = [Message("system", "you are a tiny model")]
    for earlier in session.transcript[:2]:
        messages += [Message("user", earlier.question), Message("assistant", earlier.answer)]
    text = session.prompts.render([*messages, Message("user", QUESTIONS[2])])
    assert prompt == session.verifier.tokenize(text)
    # And the answer is a fresh start's: the verifier alone, greedy, on that text's tokens.
    alone = LlamaModel(tiny_verifier, n_ctx=2048, n_threads=1)
    events = speculate(
        verifier=alone,
        drafter=None,
        prompt_tokens=alone.tokenize(text),
        k=FixedK(0),
        max_tokens=session.max_tokens,
        settings=SamplingSettings(temperature=0),
        rng=np.random.default_rng(0),
    )
    assert turn.answer_tokens == [token for event in events for token in event.tokens]
    alone.close()


def test_a_full_context_drops_the_oldest_turns_and_keeps_the_system_prompt(tiny_verifier, tiny_draft):
    session = make_session(tiny_verifier, tiny_draft, n_ctx=200, max_tokens=30, system="be brief")
    system_prefix = session.conversation_tokens([], "x")[:10]
    dropped = 0
    for question in QUESTIONS * 2:
        turn, prompt = answer(session, question)
        dropped = session.first_in_context
        assert prompt[:10] == system_prefix and len(prompt) < session.n_ctx
        assert turn.answer_tokens  # every question is answered
    assert dropped >= 3 and len(session.transcript) == 2 * len(QUESTIONS)  # all kept for /save
    before = len(session.transcript)
    with pytest.raises(ContextFullError, match="context holds 200"):
        session.ask("the cat " * 200)
    assert len(session.transcript) == before and session.first_in_context == dropped


def test_reset_keeps_the_cached_system_prompt(tiny_verifier, tiny_draft):
    session = make_session(tiny_verifier, tiny_draft, system="you are a tiny model")
    first, prompt = answer(session, QUESTIONS[0])
    answer(session, QUESTIONS[1])
    session.reset()
    assert session.transcript == [] and session.totals.n_tokens == 0
    again, again_prompt = answer(session, QUESTIONS[0])
    assert again_prompt == prompt and again.n_evaluated["verifier"] == 1  # only the pending last token
    assert again.answer_tokens == first.answer_tokens


class InterruptedOnce(CountingModel):
    """Raises KeyboardInterrupt (a second Ctrl-C) once, after llama.cpp evaluated a verify batch but
    before the model's `cached` list recorded it: the worst moment, a cache out of step."""

    armed = True

    def eval_tree(self, tokens, parents, *, n_logits):
        if not self.armed:
            return super().eval_tree(tokens, parents, n_logits=n_logits)
        self.armed = False
        super().eval_tree(tokens, parents, n_logits=n_logits)
        del self.model.cached[-len(tokens) :]
        raise KeyboardInterrupt


def test_a_second_ctrl_c_inside_a_model_call_keeps_the_chat_going(tiny_verifier, tiny_draft, monkeypatch):
    from io import StringIO

    from rich.console import Console

    from specgguf.cli.chat import ChatRepl
    from specgguf.kchoice import KChoice

    monkeypatch.setattr(reading, "LONG_READ", 10**6)  # the draft reads at once (not when the machine's timings say)
    session = make_session(tiny_verifier, tiny_draft)
    session.verifier = InterruptedOnce(session.verifier.model)
    lines = iter(["hello the cat", "and the dog"])
    out, err = StringIO(), StringIO()
    ChatRepl(
        session,
        reader=type("Lines", (), {"read": lambda self: next(lines, None)})(),
        interactive=False,
        out=out,
        out_console=None,
        err_console=Console(file=err, width=200),
        quiet=False,
        show_rejected=False,
        models={},
        k_choice=KChoice("fixed", 3),
        choose_k=lambda choice, temperature: (FixedK(choice.k), "K"),
    ).loop()
    first, second = session.transcript
    assert first.stop == "interrupted" and "(interrupted)" in err.getvalue()
    # Both caches were emptied, so the next turn evaluated the whole conversation, and llama.cpp took it.
    assert second.n_evaluated == {"verifier": second.n_prompt, "draft": second.n_prompt}
    assert second.stop == "max_tokens" and len(second.answer_tokens) == session.max_tokens
    assert out.getvalue().count("\n\n") >= 1 and "Traceback" not in err.getvalue()
