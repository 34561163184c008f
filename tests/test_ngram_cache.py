"""The session n-gram cache (ngram_cache.py): learning, drafting, its bound, and its files."""

from __future__ import annotations

import io
import os
import random
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from specgguf.core import ngram_cache, ngram_store
from specgguf.core.ngram_cache import NgramCacheError, SessionNgrams
from specgguf.errors import SpecggufError

KEY = "verifier-sha:draft-sha"


def learned(tokens: list[int], **options) -> SessionNgrams:
    cache = SessionNgrams(**options)
    cache.learn(tokens)
    return cache


# --- learning and drafting ---------------------------------------------------------------------------


def test_the_longest_known_suffix_decides():
    # (1, 2) was followed by 3 twice, but (7, 1, 2) by 9 once: the longer context wins.
    cache = learned([1, 2, 3, 0, 1, 2, 3, 0, 7, 1, 2, 9])
    assert cache.lookup([5, 7, 1, 2], 1) == ([9], 3)
    assert cache.lookup([5, 8, 1, 2], 1) == ([3], 2)  # (8, 1, 2) unknown: the 2-gram answers


def test_the_most_frequent_follower_wins_and_ties_go_to_the_most_recent():
    assert learned([1, 2, 3, 1, 2, 3, 1, 2, 4]).lookup([1, 2], 1) == ([3], 2)  # 3 twice, 4 once
    assert learned([1, 2, 3, 1, 2, 4], min_n=2, max_n=2).lookup([1, 2], 1) == ([4], 2)  # 1 each: 4 is newer
    assert learned([1, 2, 4, 1, 2, 3], min_n=2, max_n=2).lookup([1, 2], 1) == ([3], 2)
    # 3, 4, 4, 3: tied at 2 each, and 3 was counted last
    assert learned([1, 2, 3, 1, 2, 4, 1, 2, 4, 1, 2, 3], min_n=2, max_n=2).lookup([1, 2], 1) == ([3], 2)


def test_drafts_chain_up_to_k_through_their_own_tokens():
    cache = learned([10, 11, 12, 13, 14, 10, 11, 12, 13, 14])
    assert cache.lookup([10, 11], 3) == ([12, 13, 14], 2)
    assert cache.lookup([10, 11], 7) == ([12, 13, 14, 10, 11, 12, 13], 2)
    assert cache.lookup([10, 11], 0) == ([], 0)


def test_drafting_stops_where_nothing_matches():
    cache = learned([1, 2, 3, 4])
    assert cache.lookup([1, 2], 8) == ([3, 4], 2)  # nothing ever followed (3, 4)
    assert cache.lookup([4, 1], 8) == ([], 0)
    assert cache.lookup([], 8) == ([], 0)
    assert cache.lookup([2], 8) == ([], 0)  # shorter than min_n


def test_drafting_stops_when_the_best_follower_is_a_minority():
    # (1, 2) -> 3, 4, 5: the best has a third of the counts
    tokens = [1, 2, 3, 1, 2, 4, 1, 2, 5]
    assert learned(tokens, max_n=2).lookup([1, 2], 4) == ([], 0)
    assert learned(tokens, max_n=2, min_share=0.3).lookup([1, 2], 1) == ([5], 2)
    # a confident first step, then an unsure one: (8, 9) -> 1 always, (9, 1) -> 2 and 7
    chain = learned([8, 9, 1, 2, 0, 9, 1, 7, 0], max_n=2)
    assert chain.lookup([8, 9], 4) == ([1, 7, 0], 2)  # 7: 1 of 2 is a share of 0.5, enough
    assert learned([8, 9, 1, 2, 0, 9, 1, 7, 0], max_n=2, min_share=0.6).lookup([8, 9], 4) == ([1], 2)


def test_only_n_grams_from_min_n_to_max_n_are_stored_and_used():
    tokens = list(range(100, 120))  # all distinct: each n-gram once
    for min_n, max_n in [(1, 1), (2, 4), (3, 3), (1, 6)]:
        cache = learned(tokens, min_n=min_n, max_n=max_n)
        assert len(cache) == sum(len(tokens) - n for n in range(min_n, max_n + 1))
    only_3 = learned([1, 2, 3, 4, 5, 6], min_n=3, max_n=3)
    assert only_3.lookup([9, 2, 3], 1) == ([], 0)  # (2, 3) would know 4, but 2-grams are not kept
    assert only_3.lookup([1, 2, 3], 1) == ([4], 3)
    long_context = learned([1, 2, 3, 4, 5, 6], min_n=1, max_n=2)
    assert long_context.lookup([1, 2, 3, 4], 1) == ([5], 2)  # never more than max_n tokens matched


def test_learning_incrementally_with_start_equals_learning_all_at_once(tmp_path):
    rng = random.Random(5)
    tokens = [rng.randrange(6) for _ in range(400)]  # a small vocabulary: many repeats, many ties
    at_once = learned(tokens, min_n=1, max_n=4)
    growing = SessionNgrams(min_n=1, max_n=4)
    done = 0
    while done < len(tokens):
        end = min(len(tokens), done + rng.randrange(1, 9))
        growing.learn(tokens[:end], start=done)
        done = end
    assert len(growing) == len(at_once)
    at_once.save(tmp_path / "a.npz", key=KEY)
    growing.save(tmp_path / "b.npz", key=KEY)
    with np.load(tmp_path / "a.npz") as a, np.load(tmp_path / "b.npz") as b:
        for name in a.files:
            assert np.array_equal(a[name], b[name]), name  # same counts, same order, same best followers
    for at in range(len(tokens)):
        assert growing.lookup(tokens[:at], 8) == at_once.lookup(tokens[:at], 8)


def _arrays(cache: SessionNgrams, path: Path) -> dict[str, np.ndarray]:
    cache.save(path, key=KEY)
    with np.load(path) as arrays:
        return {name: arrays[name] for name in arrays.files}


def test_conversations_re_sent_with_each_request_are_counted_once_each(tmp_path):
    # A server's drafter is new with each request, its session is not: two clients' conversations, each
    # re-sent whole and one turn longer with every request, in turn, teach what each conversation alone does.
    from specgguf.core.ngram_drafter import NgramDrafter

    rng = random.Random(7)
    turns = {name: [rng.randrange(9) for _ in range(40)] for name in "ab"}
    session = SessionNgrams(min_n=1, max_n=4)
    for _ in range(4):
        for name in "ab":
            drafter = NgramDrafter(session=session)
            drafter.prepare(list(turns[name]))  # the request's prompt: a new list, the conversation again
            context = list(turns[name])  # the engine's own list, growing as the answer is settled
            for _ in range(12):
                context.append(rng.randrange(9))
                drafter.sync(context)
            turns[name] = context + [rng.randrange(9) for _ in range(5)]  # the client's next message
    once = SessionNgrams(min_n=1, max_n=4)
    for name in "ab":
        once.learn(turns[name][:-5])  # each conversation as it was last sent and answered
    got, want = _arrays(session, tmp_path / "session.npz"), _arrays(once, tmp_path / "once.npz")
    assert sorted(zip(got["ngram_lengths"], got["n_followers"])) == sorted(
        zip(want["ngram_lengths"], want["n_followers"])
    )
    assert got["follower_counts"].sum() == want["follower_counts"].sum()  # re-sent, not counted again
    # What it has counted of a text: the longest prefix shared with one it saw lately.
    assert session.learned_prefix(turns["a"]) == len(turns["a"]) - 5
    assert session.learned_prefix([99, *turns["a"]]) == 0


def test_a_session_remembers_its_most_recent_texts_only():
    session = SessionNgrams()
    texts = [[n, 1, 2, 3] for n in range(ngram_cache.RECENT_TEXTS + 1)]
    for text in texts:
        session.learn(text)
    assert session.learned_prefix(texts[-1] + [4]) == 4
    assert session.learned_prefix(texts[0]) == 0  # the oldest forgotten: counted again if sent again
    grown = texts[1]
    grown.append(5)  # the same list, learned further: one entry, not two
    session.learn(grown, start=4)
    assert session.learned_prefix(texts[2]) == 4 and session.learned_prefix(grown) == 5


def test_learning_takes_numpy_arrays_and_rejects_impossible_token_ids():
    cache = SessionNgrams()
    cache.learn(np.array([1, 2, 3, 1, 2], dtype=np.int32))
    assert cache.lookup(np.array([1, 2]), 2) == ([3, 1], 2)
    with pytest.raises(ValueError):
        cache.learn([1, -2, 3])
    with pytest.raises(ValueError):
        cache.learn([1, 2**31, 3])
    with pytest.raises(ValueError):
        SessionNgrams(min_n=3, max_n=2)


def test_past_max_entries_the_least_recently_learned_n_grams_go():
    cache = SessionNgrams(min_n=2, max_n=2, max_entries=5)
    cache.learn(list(range(20)))  # 18 distinct 2-grams
    assert len(cache) == 5
    assert cache.lookup([0, 1], 1) == ([], 0)
    assert cache.lookup([12, 13], 1) == ([], 0)
    assert cache.lookup([13, 14], 6) == ([15, 16, 17, 18, 19], 2)
    # learning (13, 14) -> 15 again makes it the newest: the next new n-gram evicts (14, 15) instead
    cache.learn([13, 14, 15])
    cache.learn([50, 51, 52])
    assert len(cache) == 5
    assert cache.lookup([14, 15], 1) == ([], 0)
    assert cache.lookup([13, 14], 1) == ([15], 2)
    assert cache.lookup([15, 16], 3) == ([17, 18, 19], 2)
    assert cache.lookup([50, 51], 1) == ([52], 2)


# --- files -------------------------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path) -> Path:
    rng = random.Random(7)
    cache = learned([rng.randrange(50) for _ in range(3000)], min_n=1, max_n=4)
    path = tmp_path / "session.npz"
    cache.save(path, key=KEY)
    return path


def rewrite(path: Path, **changes: np.ndarray | None) -> None:
    """Rewrite a saved cache with some arrays replaced (or left out, for None)."""
    with np.load(path) as npz:
        arrays = {name: npz[name] for name in npz.files}
    for name, array in changes.items():
        if array is None:
            del arrays[name]
        else:
            arrays[name] = array
    with open(path, "wb") as file:
        np.savez(file, **arrays)


def test_a_saved_cache_loads_back_the_same(tmp_path):
    rng = random.Random(3)
    tokens = [rng.randrange(40) for _ in range(5000)]
    cache = learned(tokens, min_n=1, max_n=4)
    path = tmp_path / "cache.npz"
    cache.save(path, key=KEY)
    loaded = SessionNgrams.load(path, key=KEY, min_n=1, max_n=4)
    assert len(loaded) == len(cache)
    for at in range(0, len(tokens), 7):
        assert loaded.lookup(tokens[:at], 16) == cache.lookup(tokens[:at], 16)
    loaded.learn(tokens + [1, 2, 3], start=len(tokens))  # and it keeps learning as the original would
    cache.learn(tokens + [1, 2, 3], start=len(tokens))
    loaded.save(tmp_path / "again.npz", key=KEY)
    cache.save(path, key=KEY)
    with np.load(path) as a, np.load(tmp_path / "again.npz") as b:
        assert all(np.array_equal(a[name], b[name]) for name in a.files)
    empty = tmp_path / "empty.npz"
    SessionNgrams().save(empty, key="")
    assert len(SessionNgrams.load(empty, key="")) == 0


def test_a_tie_is_broken_the_same_way_after_loading(tmp_path):
    # (1, 2) -> 3, 4, 4, 3: tied, 3 counted last; counted first too, so it is not simply the last one stored
    cache = learned([1, 2, 3, 1, 2, 4, 1, 2, 4, 1, 2, 3], min_n=2, max_n=2)
    cache.save(tmp_path / "tie.npz", key=KEY)
    loaded = SessionNgrams.load(tmp_path / "tie.npz", key=KEY, min_n=2, max_n=2)
    assert loaded.lookup([1, 2], 1) == cache.lookup([1, 2], 1) == ([3], 2)
    for each in (cache, loaded):
        each.learn([1, 2, 4])  # 4 now leads, 3 to 2
        assert each.lookup([1, 2], 1) == ([4], 2)


def test_a_file_with_more_n_grams_than_max_entries_keeps_the_newest(tmp_path):
    path = tmp_path / "cache.npz"
    learned(list(range(100)), min_n=2, max_n=2).save(path, key=KEY)
    small = SessionNgrams.load(path, key=KEY, max_entries=10)
    assert len(small) == 10
    assert small.lookup([89, 90], 20) == (list(range(91, 100)), 2)
    assert small.lookup([87, 88], 1) == ([], 0)  # 98 n-grams: the first 88 are left out


def rejection(path: Path, **options) -> str:
    with pytest.raises(NgramCacheError) as raised:
        SessionNgrams.load(path, **{"key": KEY, "min_n": 1, "max_n": 4, **options})
    message = str(raised.value)
    assert isinstance(raised.value, SpecggufError)
    assert str(path) in message and "\n" not in message
    return message


def test_load_refuses_another_key_or_format_version(saved):
    assert "another model pair" in rejection(saved, key="other-pair")
    rewrite(saved, version=np.array(2, dtype=np.int64))
    assert "format version 2" in rejection(saved)


def test_load_refuses_missing_and_non_files(tmp_path):
    assert "no such file" in rejection(tmp_path / "absent.npz")
    assert "not a regular file" in rejection(tmp_path)
    fifo = tmp_path / "fifo.npz"
    os.mkfifo(fifo)  # opening it to read would block until a writer came
    assert "not a regular file" in rejection(fifo)


def test_load_refuses_files_that_are_not_npz(tmp_path):
    text = tmp_path / "notes.npz"
    text.write_text("not a cache\n")
    assert "corrupt" in rejection(text)
    npy = tmp_path / "array.npz"
    with open(npy, "wb") as file:
        np.save(file, np.arange(5))  # an .npy, not an .npz
    assert "corrupt" in rejection(npy)
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    assert "corrupt" in rejection(empty)


def test_load_refuses_every_truncation(saved):
    data = saved.read_bytes()
    for size in sorted({*range(0, len(data), max(1, len(data) // 97)), len(data) - 1, len(data) - 22}):
        saved.write_bytes(data[:size])
        assert "corrupt" in rejection(saved)


def test_a_flipped_byte_never_loads_as_different_counts(saved, tmp_path):
    # zip's CRC-32 covers the array data; the .npy headers and zip directory are checked as they are parsed.
    with np.load(saved) as npz:
        original = {name: npz[name] for name in npz.files}
    data = saved.read_bytes()
    rng = random.Random(11)
    for _ in range(300):
        damaged = bytearray(data)
        damaged[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        saved.write_bytes(bytes(damaged))
        try:
            loaded = SessionNgrams.load(saved, key=KEY, min_n=1, max_n=4)
        except NgramCacheError:
            continue
        # a byte no reader checks (a timestamp, a version-made-by field): the counts must be intact
        loaded.save(tmp_path / "resaved.npz", key=KEY)
        with np.load(tmp_path / "resaved.npz") as npz:
            assert all(np.array_equal(npz[name], original[name]) for name in npz.files)


def test_load_refuses_pickled_arrays(saved):
    rewrite(saved, key=np.array([{"pickled": True}], dtype=object))
    assert "corrupt" in rejection(saved)


def test_load_refuses_foreign_or_missing_arrays(saved):
    rewrite(saved, extra=np.arange(3))
    assert "unexpected contents" in rejection(saved)
    rewrite(saved, extra=None, follower_counts=None)
    assert "unexpected contents" in rejection(saved)


@pytest.mark.parametrize(
    "name, array",
    [
        ("ngram_tokens", lambda a: a.astype(np.float32)),
        ("ngram_tokens", lambda a: a.astype(np.int64)),  # ids past 2**31 would need this
        ("follower_counts", lambda a: a.astype(np.int32)),
        ("ngram_lengths", lambda a: a.reshape(1, -1)),
        ("key", lambda a: np.array(str(a).encode())),
        ("version", lambda a: np.array([1], dtype=np.int64)),
    ],
)
def test_load_refuses_wrong_dtypes_and_shapes(saved, name, array):
    with np.load(saved) as npz:
        original = npz[name]
    rewrite(saved, **{name: array(original)})
    assert f"array {name} has dtype" in rejection(saved)


def test_load_refuses_inconsistent_or_out_of_range_values(saved):
    with np.load(saved) as npz:
        arrays = {name: npz[name] for name in npz.files}
    data = saved.read_bytes()

    def refused(reason: str, **changes: np.ndarray) -> None:
        saved.write_bytes(data)
        rewrite(saved, **changes)
        assert reason in rejection(saved)

    tokens, counts = arrays["ngram_tokens"].copy(), arrays["follower_counts"].copy()
    tokens[5] = -1
    refused("negative token ids in ngram_tokens", ngram_tokens=tokens)
    followers = arrays["follower_tokens"].copy()
    followers[-1] = -(2**31)
    refused("negative token ids in follower_tokens", follower_tokens=followers)
    counts[0] = 0
    refused("follower counts outside", follower_counts=counts)
    refused("n-gram lengths and n-gram tokens disagree", ngram_tokens=arrays["ngram_tokens"][:-1])
    refused("follower lengths disagree", follower_counts=arrays["follower_counts"][:-1])
    refused("lengths and follower counts disagree", n_followers=arrays["n_followers"][:-1])
    no_followers = arrays["n_followers"].copy()
    no_followers[0] = 0
    refused("no follower", n_followers=no_followers)
    # n-grams outside the loader's min_n..max_n
    saved.write_bytes(data)
    assert "outside 2..4 tokens" in rejection(saved, min_n=2)
    assert "outside 1..3 tokens" in rejection(saved, max_n=3)
    # the same n-gram twice
    lengths = arrays["ngram_lengths"]
    first = arrays["ngram_tokens"][: lengths[0]]
    refused(
        "stored twice",
        ngram_lengths=np.concatenate([lengths, lengths[:1]]),
        ngram_tokens=np.concatenate([arrays["ngram_tokens"], first]),
        n_followers=np.concatenate([arrays["n_followers"], [1]]).astype(np.int32),
        follower_tokens=np.concatenate([arrays["follower_tokens"], [3]]).astype(np.int32),
        follower_counts=np.concatenate([arrays["follower_counts"], [1]]),
    )


def test_load_refuses_a_zip_that_claims_to_unpack_past_the_limit(saved, monkeypatch):
    monkeypatch.setattr(ngram_store, "MAX_FILE_BYTES", saved.stat().st_size // 2)
    assert "unpacked" in rejection(saved)


@pytest.mark.parametrize("claimed", [10**6, 10**8, 10**12, 2**62])
def test_load_refuses_an_array_header_that_claims_more_than_its_data(saved, claimed):
    # the .npy header inside the zip says `claimed` items; the data is a few bytes (no allocation, no hang)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": (claimed,)})
    with zipfile.ZipFile(saved) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members["follower_counts.npy"] = header.getvalue() + b"\x01" * 64
    with zipfile.ZipFile(saved, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    tracemalloc.start()  # numpy reports its allocations here: 10**8 entries were 800 MB allocated, then EOF
    try:
        message = rejection(saved)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"the header of follower_counts claims {claimed} entries, its data is 64 bytes" in message
    assert peak < 10 << 20


# --- atomic saving -----------------------------------------------------------------------------------


def test_a_failed_save_leaves_the_old_file_and_no_temporary_file(saved, monkeypatch):
    before = saved.read_bytes()
    bigger = learned(list(range(1000)), min_n=1, max_n=4)

    def no_replace(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ngram_store.os, "replace", no_replace)
    with pytest.raises(NgramCacheError, match="No space left on device"):
        bigger.save(saved, key=KEY)
    assert saved.read_bytes() == before
    assert sorted(saved.parent.iterdir()) == [saved]
    monkeypatch.undo()

    def half_written(file, **arrays):
        file.write(b"PK\x03\x04 half an archive")
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(ngram_store.np, "savez", half_written)
    with pytest.raises(NgramCacheError, match="Input/output error"):
        bigger.save(saved, key=KEY)
    assert saved.read_bytes() == before
    assert sorted(saved.parent.iterdir()) == [saved]
    monkeypatch.undo()
    bigger.save(saved, key=KEY)  # and a save that works replaces it
    assert len(SessionNgrams.load(saved, key=KEY, min_n=1, max_n=4)) == len(bigger)
    assert sorted(saved.parent.iterdir()) == [saved]


def test_saving_into_a_missing_folder_is_one_error(tmp_path):
    with pytest.raises(NgramCacheError, match="could not save"):
        SessionNgrams().save(tmp_path / "absent" / "cache.npz", key=KEY)


def test_a_request_s_prompt_and_the_context_going_on_from_it_are_one_recent_text():
    # The drafter counts a request's prompt, then the engine's own list (the prompt and its answer): one
    # conversation, so a session remembers RECENT_TEXTS conversations, not half as many.
    session = SessionNgrams()
    conversations = [[n, n + 100, 1, 2, 3] for n in range(ngram_cache.RECENT_TEXTS)]
    for prompt in conversations:
        session.learn(prompt)
        context = list(prompt)  # a new list, as the engine makes it
        context += [4, 5]
        session.learn(context, start=len(prompt))
    assert session.learned_prefix(conversations[0] + [4, 5, 6]) == len(conversations[0]) + 2
    session.learn([7, 8, 9])  # another conversation, not one going on from the newest: its own text
    assert session.learned_prefix(conversations[-1] + [4, 5]) == len(conversations[-1]) + 2
    assert session.learned_prefix(conversations[0]) == 0  # the oldest now forgotten
