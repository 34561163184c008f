"""scripts/draft_bound.py's oracle schedule and scripts/draft_policies.py's replays, on hand-made answers:
what each charges for a step, checked against the sums worked out by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import draft_policies  # noqa: E402
from copy_bound import schedule_time  # noqa: E402 - the scripts, from scripts/
from draft_bound import costs, runs_of  # noqa: E402
from draft_policies import replay  # noqa: E402

VERIFY = [1.0, 1.2, 1.4, 1.6, 1.8]  # seconds for 1..5 rows
PASS = 0.25  # a draft pass


def test_a_draft_never_right_leaves_plain_decoding():
    model = [0] * 6
    cost = costs(model, [0] * 6, PASS)["model"]
    assert schedule_time(6, VERIFY, cost) == pytest.approx(5 * VERIFY[0])  # token 0 came with the prompt's pass


def test_the_oracle_drafts_what_pays_and_only_what_is_right():
    model = runs_of([True] * 9)
    # From token 1: 8 tokens to make. Drafting 3 (3 passes + 4 rows) makes 4 for 0.75 + 1.6 = 2.35 s,
    # twice: 4.7 s; drafting 4 (1.0 + 1.8) makes 5, then 3 are left (2 drafts + 3 rows: 0.5 + 1.4): 4.7 s too.
    assert schedule_time(9, VERIFY, costs(model, [0] * 9, PASS)["model"]) == pytest.approx(4.7)
    wrong_at_2 = runs_of([True, True, False, True, True, True])
    # Tokens 1..5: a draft of 1 at t = 1 (1 pass + 2 rows) makes 2; at 3 the draft is right twice more.
    assert schedule_time(6, VERIFY, costs(wrong_at_2, [0] * 6, PASS)["model"]) == pytest.approx(
        (PASS + VERIFY[1]) + (2 * PASS + VERIFY[2])  # t=1 -> 3 (token 2 is the verifier's), t=3 -> 6
    )


def test_copies_are_free_and_the_model_reads_past_them():
    model, copy = [0, 0, 0, 2, 1, 0], [0, 2, 1, 0, 0, 0]
    both, alone = costs(model, copy, PASS)["both"], costs(model, copy, PASS)["copy"]
    assert both(1, 2) == 0.0 and both(1, 3) == pytest.approx(PASS)  # 2 copied, then the model at t = 3
    assert both(1, 4) == pytest.approx(2 * PASS) and both(1, 5) is None
    assert alone(1, 3) is None
    assert schedule_time(6, VERIFY, both) <= schedule_time(6, VERIFY, alone)


def test_fixed_k_pays_every_pass_and_row_and_keeps_the_right_prefix():
    model = runs_of([True, True, False, True, True, True, True])
    confidence = [0.9] * 7
    # t = 1: 2 passes, 3 rows, keeps 1 (token 2 wrong), t -> 3; t = 3: 2 passes, 3 rows, keeps 2, t -> 6;
    # t = 6: nothing left to draft (n - t - 1 = 0), one row.
    spent = replay(model, confidence, VERIFY, PASS, k=2, p_min=0.0, stop_wrong=False)
    assert spent == pytest.approx(2 * (2 * PASS + VERIFY[2]) + VERIFY[0])


def test_p_min_spends_the_pass_it_refuses_and_stopping_at_the_wrong_draft_flatters():
    model = runs_of([True, True, True, False, True, True])
    confidence = [0.9, 0.9, 0.9, 0.3, 0.9, 0.9]
    # t = 1: drafts at 1, 2 (0.9), the pass for 3 sees 0.3 < 0.5: 3 passes, 2 proposed and kept, t -> 4;
    # t = 4: 1 draft (n - t - 1 = 1), kept, t -> 6.
    spent = replay(model, confidence, VERIFY, PASS, k=4, p_min=0.5, stop_wrong=False)
    assert spent == pytest.approx((3 * PASS + VERIFY[2]) + (PASS + VERIFY[1]))
    sure = [0.9] * 6  # a wrong draft at 3 that the draft is sure of: drafting on to K costs more rows
    harsh = replay(model, sure, VERIFY, PASS, k=4, p_min=0.5, stop_wrong=False)
    flattered = replay(model, sure, VERIFY, PASS, k=4, p_min=0.5, stop_wrong=True)
    assert flattered < harsh


@pytest.mark.parametrize(
    "text", [None, "not json", '{"verify": [1.0]}', '{"verify": [1.0], "draft_pass": 0.1, "prompts": [{}]}']
)
def test_a_file_draft_bound_did_not_write_is_one_error_line(tmp_path, monkeypatch, text):
    stored = tmp_path / "bound.json"
    if text is not None:
        stored.write_text(text)
    monkeypatch.setattr(sys, "argv", ["draft_policies.py", str(stored)])
    with pytest.raises(SystemExit) as exit:
        draft_policies.main()
    message = str(exit.value.code)
    assert (
        message.startswith(f"specgguf: error: {stored}: not a file draft_bound.py --out wrote") and "\n" not in message
    )
