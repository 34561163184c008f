"""Each step event carries the verifier's logits row for every token it emits (for log-probabilities)."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import FakeModel
from specgguf.core.engine import speculate
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.sampling import SamplingSettings

VOCAB, EOS = 10, 9


def verifier_logits(context):
    """Distinct logits for every context: counts 1..8, ends after the 17th token."""
    logits = np.linspace(0.0, 1.0, VOCAB) * (len(context) % 5)
    logits[EOS if len(context) >= 18 else context[-1] % 8 + 1] = 6.0
    return logits


def draft_logits(context):
    logits = np.zeros(VOCAB)
    logits[1 if context[-1] % 3 == 0 else context[-1] % 8 + 1] = 6.0  # wrong after multiples of 3
    return logits


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_rows_score_the_emitted_tokens_in_order(temperature):
    verifier = FakeModel(verifier_logits, n_vocab=VOCAB, eog=[EOS])
    draft = FakeModel(draft_logits, n_vocab=VOCAB, eog=[EOS])
    context = [1]
    events = list(
        speculate(
            verifier=verifier,
            drafter=ModelDrafter(draft),
            prompt_tokens=context,
            k=4,
            max_tokens=40,
            settings=SamplingSettings(temperature=temperature),
            rng=np.random.default_rng(0),
        )
    )
    assert events[-1].stop == "eos" and any(event.rejected for event in events)
    for event in events:
        assert event.target_logits.shape == (len(event.tokens), VOCAB)
        for token, row in zip(event.tokens, event.target_logits):
            np.testing.assert_allclose(row, verifier_logits(context))
            context.append(token)
