"""A draft for a verifier given alone (`-m` without `-md`), found among the models already here.

The order: a registry pair whose verifier is this file (by SHA-256 where the store names it, else
by file name) and whose draft is here; else the smallest local model that llama.cpp would pair
with it (llama/compat.py's rules: the tokenizer's scalars and the vocabulary fingerprint first,
files/gguf_header.py, then the chosen one confirmed by llama.cpp's own vocabulary loader) at most
about a quarter of the verifier's size. None: the caller drafts with n-grams alone.
`local_pairs` lists every compatible pair among the local files (`specgguf pairs --local`).
Drafts of another vocabulary are drafts/cross_search.py's, which asks this module first.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecggufError, terminal_safe
from ..files.gguf_header import START, STEP, SummaryIndex, VocabSummary, tail_texts
from ..files.local_models import LocalModel, local_models
from ..files.registry import ModelFile, Pair, load_registry
from ..files.resolve import find_local
from ..files.stamps import size_text
from ..llama.compat import CHECK_START_TOKEN_ID, MAX_VOCAB_SIZE_DIFFERENCE, VocabInfo, compare_vocabularies

MAX_RATIO = 0.3  # "about a quarter": a larger draft costs too much of what it saves
assert CHECK_START_TOKEN_ID == START, "the fingerprint starts where llama.cpp's text check does"


@dataclass(frozen=True)
class Found:
    model: LocalModel
    summary: VocabSummary


@dataclass(frozen=True)
class FoundDraft:
    """The draft found for a verifier given alone (not made.DraftChoice: which file of a draft loads)."""

    draft: Path | None  # None: no draft model; draft with n-grams alone
    message: str  # which one and why, for stderr
    pair: Pair | None = None  # the registry pair, when it decided
    cross: bool = False  # of another vocabulary (drafts/cross_search.py): adopted only where measured to pay


def _agree(ours: object, theirs: object) -> bool:
    return ours is None or theirs is None or ours == theirs  # absent: llama.cpp's default, confirmed later


def vocab_match(verifier: VocabSummary, draft: VocabSummary) -> bool:
    """llama.cpp's rules over two summaries: tokenizer, specials, sizes within 128, texts from id 5."""
    if verifier.tokenizer != draft.tokenizer or not verifier.n_vocab or not draft.n_vocab:
        return False
    if not all(_agree(getattr(verifier, key), getattr(draft, key)) for key in ("bos", "eos", "add_bos", "add_eos")):
        return False
    if abs(verifier.n_vocab - draft.n_vocab) > MAX_VOCAB_SIZE_DIFFERENCE:
        return False
    shared = min(verifier.n_vocab, draft.n_vocab)
    if shared <= START:
        return True
    step = (shared - START) // STEP
    checkpoint = START + STEP * step
    try:
        if verifier.prefix[step] != draft.prefix[step]:
            return False
        return tail_texts(verifier, checkpoint, shared) == tail_texts(draft, checkpoint, shared)
    except (IndexError, ValueError):  # a damaged index entry: no match (and it is read again next time)
        return False


def _confirmed(verifier: VocabInfo, draft: Path) -> bool:
    """llama.cpp's own check over the two vocabularies (a vocab-only load: no weights), as `check` runs it."""
    from ..llama.vocab import read_vocab

    try:
        return all(finding.ok for finding in compare_vocabularies(verifier, read_vocab(draft)[0]))
    except SpecggufError:
        return False


def _sha256(path: Path) -> str | None:
    """A SHA-256 the store names the file by: Ollama's `sha256-<hex>` blob, the hub's LFS blob."""
    name = path.resolve().name.removeprefix("sha256-")
    return name if len(name) == 64 and all(c in "0123456789abcdef" for c in name) else None


def _is(path: Path, model: ModelFile) -> bool:
    digest = _sha256(path)
    if digest is not None and model.sha256 is not None:
        return digest == model.sha256
    if path.name.lower() == model.file.rsplit("/", 1)[-1].lower():
        return True
    local = find_local(model)
    return local is not None and local.resolve() == path.resolve()


def _registry_pairs(verifier: Path) -> list[Pair]:
    return [pair for pair in load_registry().pairs.values() if _is(verifier, pair.verifier)]


def _registry_draft(verifier: Path, vocab: VocabInfo, here: list[LocalModel]) -> FoundDraft | None:
    for pair in _registry_pairs(verifier):
        found = find_local(pair.draft)
        model = next((model for model in here if _is(model.path, pair.draft)), None)
        draft = found or (model.path if model else None)
        if draft is not None and _confirmed(vocab, draft):
            name = model.ref if model is not None and model.path == draft else str(draft)
            return FoundDraft(
                draft, f"draft: {name} (the registry pairs this verifier with {pair.draft.ref}: pair {pair.name})", pair
            )
    return None


def scan(models: list[LocalModel], index: SummaryIndex, *, warn: bool = True) -> list[Found]:
    """The readable GGUF models among `models`, each with its summary; each other one skipped (with a
    warning unless `warn` is False: a second look, after one that warned)."""
    found = []
    for model in models:
        try:
            found.append(Found(model, index.get(model.path)))
        except (SpecggufError, OSError) as error:  # not a GGUF, cut short, malformed, unreadable: never a draft
            if warn:
                _skipped(model, error)
    return found


def _skipped(model: LocalModel, error: Exception) -> None:
    if isinstance(error, OSError):
        reason = error.strerror or str(error)
    else:
        reason = str(error).removeprefix(f"{model.path}: ").removeprefix(f"{model.path.resolve()}: ")
    if sys.stderr is not None:
        sys.stderr.write(f"specgguf: warning: skipped {terminal_safe(model.ref)}: {terminal_safe(reason)}\n")


def find_draft(verifier: Path) -> FoundDraft | None:
    """The draft for `verifier` (see the module's note); never raises for want of one.
    None: llama.cpp cannot read the verifier's vocabulary (loading it will say why)."""
    from ..llama.vocab import read_vocab

    try:
        vocab = read_vocab(verifier)[0]
    except SpecggufError:
        return None
    here = local_models()
    if (chosen := _registry_draft(verifier, vocab, here)) is not None:
        return chosen
    index = SummaryIndex()
    try:
        ours = index.get(verifier)
    except (SpecggufError, OSError):
        return FoundDraft(None, "no draft: the verifier's header could not be read; drafting with n-grams alone")
    real = verifier.resolve()
    others = [model for model in here if model.path.resolve() != real]
    compatible = sorted(
        (item for item in scan(others, index) if vocab_match(ours, item.summary)), key=lambda item: item.summary.size
    )
    index.save()
    small = [item for item in compatible if item.summary.size <= MAX_RATIO * ours.size]
    for item in small:
        if _confirmed(vocab, item.model.path):
            ratio = item.summary.size / ours.size
            return FoundDraft(
                item.model.path,
                f"draft: {item.model.ref} ({size_text(item.summary.size)}, {ratio:.0%} of the verifier): the smallest"
                f" of {len(small)} local models that share the verifier's vocabulary and are at most ~1/4 its size",
            )
    if compatible:
        item = compatible[0]
        return FoundDraft(
            None,
            f"no draft: the smallest local model that shares the verifier's vocabulary, {item.model.ref}, is"
            f" {item.summary.size / ours.size:.0%} of its size (too large to pay; -md {item.model.ref} to try it);"
            " drafting with n-grams alone",
        )
    pull = "".join(
        f"; `specgguf pull {pair.name}` fetches its registry draft" for pair in _registry_pairs(verifier)[:1]
    )
    return FoundDraft(
        None,
        f"no draft: none of the {len(others)} local models shares the verifier's vocabulary"
        f" (`specgguf pairs --local` lists pairs){pull}; drafting with n-grams alone (prompt lookup)",
    )


@dataclass(frozen=True)
class LocalPair:
    """Two local models that share a vocabulary, the draft the smaller (cli/pairs.py shows them)."""

    draft: LocalModel
    verifier: LocalModel
    draft_size: int
    verifier_size: int

    @property
    def ratio(self) -> float:
        return self.draft_size / self.verifier_size


def local_pairs(found: list[Found] | None = None) -> list[LocalPair]:
    """Every draft/verifier pair among the local files (or `found`, scanned already) that share a
    vocabulary, the draft the smaller."""
    if found is None:
        index = SummaryIndex()
        found = scan(local_models(), index)
        index.save()
    pairs = [
        LocalPair(draft.model, verifier.model, draft.summary.size, verifier.summary.size)
        for verifier in found
        for draft in found
        if draft.summary.size < verifier.summary.size and vocab_match(verifier.summary, draft.summary)
    ]
    return sorted(pairs, key=lambda pair: (pair.verifier.ref, pair.ratio))
