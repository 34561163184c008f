"""`specgguf check DRAFT VERIFIER`: why two GGUF files can or cannot be paired, item by item.

The rules are llama.cpp's (compat.compare_vocabularies, the same check `run` and `pull`
apply); the report adds what the rules do not decide but users ask about (the chat
templates, the BOS/EOS texts, extra vocabulary ids) and, for a verifier the registry
knows, the draft it pairs with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text

from .. import tuning
from ..core.vocab_map import build_vocab_map
from ..drafts.cross_vocab import vocab_pieces
from ..errors import terminal_safe
from ..files.registry import ModelFile, Pair, Registry, load_registry
from ..files.resolve import Role, find_local, resolve_model
from ..llama.compat import CHECK_START_TOKEN_ID, MAX_VOCAB_SIZE_DIFFERENCE, Finding, VocabInfo, compare_vocabularies

META_KEYS = (
    "general.name",
    "general.basename",
    "general.size_label",
    "general.architecture",
    "tokenizer.chat_template",
)


@dataclass(frozen=True)
class Side:
    """One of the two models: as given, where it is, and what its vocabulary says."""

    given: str
    path: Path
    vocab: VocabInfo
    meta: dict[str, str]
    pair: Pair | None  # when given as a registry pair name

    @property
    def chat_template(self) -> str | None:
        return self.meta.get("tokenizer.chat_template")

    def special(self, token: int) -> str:
        if token < 0 or token >= self.vocab.n_vocab:
            return f"{token} (none)"
        return f"{token} {self.vocab.token_texts[token].decode('utf-8', 'replace')!r}"


@dataclass(frozen=True)
class Report:
    draft: Side
    verifier: Side
    findings: list[Finding]  # llama.cpp's rules: any failure refuses the pair
    notes: list[Finding] = field(default_factory=list)  # context that does not decide
    suggestions: list[str] = field(default_factory=list)
    overlap: float | None = None  # where a rule fails: the share of the verifier's tokens the draft spells

    @property
    def compatible(self) -> bool:
        """llama.cpp's rules hold: one vocabulary, and `run` drafts token for token."""
        return all(finding.ok for finding in self.findings)

    @property
    def across_vocabularies(self) -> bool:
        """A rule fails, yet `run -md` drafts through the text (drafts/cross_vocab.py): some verifier tokens
        have a draft token with the same text."""
        return not self.compatible and bool(self.overlap)

    @property
    def pairs(self) -> bool:
        """`specgguf run` can draft with this pair, one way or the other (check's exit status 0)."""
        return self.compatible or self.across_vocabularies


def read_side(given: str | Path, role: Role) -> Side:
    from ..llama.vocab import read_vocab  # llama.cpp loads only when a command needs it

    path, pair = resolve_model(given, role)
    vocab, meta = read_vocab(path, metadata_keys=META_KEYS)
    return Side(given=str(given), path=path, vocab=vocab, meta=meta, pair=pair)


def check_pair(*, draft: str | Path, verifier: str | Path, max_examples: int = 5) -> Report:
    draft_side, verifier_side = read_side(draft, "draft"), read_side(verifier, "verifier")
    findings = compare_vocabularies(verifier_side.vocab, draft_side.vocab, max_examples=max_examples)
    one_vocabulary = all(finding.ok for finding in findings)
    notes, overlap = _notes(draft_side, verifier_side, one_vocabulary=one_vocabulary), None
    if not one_vocabulary:
        cross = _cross_note(draft_side, verifier_side)
        notes.append(cross.note)
        overlap = cross.overlap
    report = Report(draft=draft_side, verifier=verifier_side, findings=findings, notes=notes, overlap=overlap)
    report.suggestions.extend(_suggestions(report, load_registry()))
    return report


def _notes(draft: Side, verifier: Side, *, one_vocabulary: bool) -> list[Finding]:
    notes = [
        Finding(
            "BOS / EOS texts",
            True,
            f"verifier BOS {verifier.special(verifier.vocab.bos)}, EOS {verifier.special(verifier.vocab.eos)};"
            f" draft BOS {draft.special(draft.vocab.bos)}, EOS {draft.special(draft.vocab.eos)}",
        )
    ]
    if draft.vocab.vocab_type != verifier.vocab.vocab_type:
        notes.append(Finding("token texts", False, "not compared: the tokenizers are of different types"))
    gap = verifier.vocab.n_vocab - draft.vocab.n_vocab
    if gap and abs(gap) <= MAX_VOCAB_SIZE_DIFFERENCE:
        larger, smaller = ("verifier", draft.vocab.n_vocab) if gap > 0 else ("draft", verifier.vocab.n_vocab)
        notes.append(
            Finding(
                "extra ids",
                True,
                f"ids {smaller}..{smaller + abs(gap) - 1} exist only in the {larger} (usually"
                " padding, e.g. Qwen2.5's 151936 vs 152064); llama.cpp allows up to"
                f" {MAX_VOCAB_SIZE_DIFFERENCE} and compares token texts from id {CHECK_START_TOKEN_ID}",
            )
        )
    notes.append(_template_note(draft.chat_template, verifier.chat_template))
    if one_vocabulary:
        notes.append(_variant_note(draft.path, verifier.path))
    else:  # prepare.load_models: drafting through text, the draft is never re-quantized or cut
        notes.append(Finding("draft variant", True, "a draft of another vocabulary is used as given"))
        notes.append(_cross_mode_note(draft.path, verifier.path))
    return notes


def _cross_mode_note(draft: Path, verifier: Path) -> Finding:
    """How `run` drafts across these vocabularies on this machine (--cross-mode auto), and why."""
    from ..drafts.cross_search import stored_choice

    measured = stored_choice(draft, verifier)
    if measured is None or measured.partial:
        return Finding(
            "cross mode",
            True,
            "not measured here yet: `specgguf run` measures its shared tokens and its own text re-encoded on"
            " first use (--cross-mode auto) and drafts in the faster"
            + ("" if measured is None else f" (so far: {measured.describe()})"),
        )
    verdict = "" if measured.trial.adopted else "; n-gram drafts alone measured faster (`-m` alone declines it)"
    return Finding("cross mode", True, f"drafts in the faster, measured here: {measured.describe()}{verdict}")


@dataclass(frozen=True)
class _Cross:
    note: Finding
    overlap: float


def _cross_note(draft: Side, verifier: Side) -> _Cross:
    """What `run -md` does with a draft of another vocabulary: drafts through the text, proposing only
    the tokens both vocabularies spell the same (drafts/cross_vocab.py)."""
    vocab_map = build_vocab_map(vocab_pieces(draft.vocab), vocab_pieces(verifier.vocab))
    covered = int(vocab_map.verifier_covered.sum())
    note = Finding(
        "shared texts",
        covered > 0,
        f"{vocab_map.overlap:.0%} of the verifier's tokens ({covered} of {verifier.vocab.n_vocab}) have a draft"
        " token with the same text: `specgguf run -md` drafts through the text (with --cross-mode tokens,"
        " proposing only those)",
    )
    return _Cross(note, vocab_map.overlap if covered else 0.0)


def _variant_note(draft: Path, verifier: Path) -> Finding:
    """Which draft `run` uses for this pair on this machine (--draft-variant auto), and why."""
    measured = tuning.stored_draft_variants(draft, verifier)
    if not measured:
        return Finding(
            "draft variant",
            True,
            "not measured here yet: `specgguf run` measures the re-quantized candidates on first use"
            " (--draft-variant auto) and keeps the fastest",
        )
    lines = []
    for threads, value in measured:
        described = "; ".join(candidate.describe() for candidate in value.candidates)
        lines.append(f"{value.choice} with {threads} threads (measured here: {described})")
    return Finding("draft variant", True, " · ".join(lines))


def _template_note(draft: str | None, verifier: str | None) -> Finding:
    if verifier is None and draft is None:
        return Finding("chat template", True, "neither file has one: prompts go in as they are (--raw)")
    if verifier is None:
        return Finding("chat template", False, "the verifier has none: run with --raw, or format prompts yourself")
    if draft == verifier:
        return Finding("chat template", True, "identical")
    which = "the draft has none" if draft is None else f"they differ ({_first_difference(verifier, draft)})"
    return Finding(
        "chat template",
        True,
        f"{which}: prompts are formatted with the verifier's template for both models, so this does"
        " not block pairing; a draft tuned for another format is accepted less often",
    )


def _first_difference(verifier: str, draft: str) -> str:
    for number, (ours, theirs) in enumerate(zip(verifier.splitlines(), draft.splitlines()), start=1):
        if ours != theirs:
            return f"from line {number}: verifier {ours.strip()[:50]!r}, draft {theirs.strip()[:50]!r}"
    return "one is longer"


def _same_file(path: Path, model: ModelFile) -> bool:
    names = {part.file.rsplit("/", 1)[-1].lower() for part in model.files()}
    if path.name.lower() in names:
        return True
    local = find_local(model)
    return local is not None and local.resolve() == path.resolve()


def _family_pairs(verifier: Side, registry: Registry) -> list[Pair]:
    """Registry pairs whose verifier repo is named like this model (basename and size)."""
    basename = verifier.meta.get("general.basename", "").lower()
    size = verifier.meta.get("general.size_label", "").lower()
    if not basename or not size:
        return []
    return [
        pair
        for pair in registry.pairs.values()
        if f"-{size}-" in "-" + pair.verifier.repo.split("/")[-1].lower() + "-"
        and basename in pair.verifier.repo.lower()
    ]


def _suggestions(report: Report, registry: Registry) -> list[str]:
    verifier, draft = report.verifier, report.draft
    pairs = (
        [verifier.pair]
        if verifier.pair
        else [pair for pair in registry.pairs.values() if _same_file(verifier.path, pair.verifier)]
    )
    matched_by = "pairs this verifier with"
    if not pairs:
        pairs, matched_by = _family_pairs(verifier, registry), "pairs a verifier like this one with"
    lines = []
    for pair in pairs:
        if draft.pair is pair or _same_file(draft.path, pair.draft):
            continue
        here = find_local(pair.draft) is not None and find_local(pair.verifier) is not None
        how = f"specgguf run --pair {pair.name}" if here else f"specgguf pull {pair.name}"
        lines.append(f"the registry's pair {pair.name!r} {matched_by} {pair.draft.ref} (K={pair.recommended_k}): {how}")
    if not lines and not report.compatible and not pairs:
        family = "(usually its smallest sibling, from the same GGUF producer)"
        lines.append(
            f"no registry pair has this verifier: a draft of the same model family {family} would share its"
            " vocabulary; see `specgguf pairs`"
            if report.across_vocabularies
            else f"no registry pair has this verifier: a draft must come from the same model family {family};"
            " see `specgguf pairs`"
        )
    return lines


def _describe(side: Side) -> Text:
    name = side.meta.get("general.name")
    arch = side.meta.get("general.architecture")
    details = ", ".join(part for part in (name, arch) if part)
    # Metadata and names come from the file: escaped, so that they cannot drive the terminal.
    shown = side.given if side.given.startswith(("ollama:", "lmstudio:")) else side.path.name  # not a blob's digest
    return Text.assemble(
        terminal_safe(shown),
        (terminal_safe(f"  ({details})") if details else "", "dim"),
        (terminal_safe(f"  [pair {side.pair.name}]") if side.pair else "", "dim"),
    )


def render_report(report: Report, console: Console) -> None:
    """The report, one line per item, then the verdict and any suggestion. Model text is never markup."""
    for role, side in (("draft", report.draft), ("verifier", report.verifier)):
        console.print(Text(f"{role:<10}", style="bold") + _describe(side))
    console.print()
    width = max(len(item.item) for item in report.findings + report.notes)
    for finding in report.findings:
        mark = Text("✓", style="green") if finding.ok else Text("✗", style="red")
        console.print(mark + Text(f"  {finding.item:<{width}}  ") + Text(terminal_safe(finding.detail)))
    for note in report.notes:
        mark = Text("·", style="dim") if note.ok else Text("!", style="yellow")
        console.print(mark + Text(f"  {note.item:<{width}}  ") + Text(terminal_safe(note.detail), style="dim"))
    console.print()
    failed = [finding.item for finding in report.findings if not finding.ok]
    if report.compatible:
        console.print(
            Text("✓ these can be paired: ", style="green bold")
            + Text("llama.cpp's rules hold, so `specgguf run` accepts this draft")
        )
    elif report.across_vocabularies:
        assert report.overlap is not None  # a rule failed, and the draft spells some verifier tokens
        console.print(
            Text("↔ these draft across vocabularies: ", style="yellow bold")
            + Text(
                f"llama.cpp's rules fail ({', '.join(failed)}), so `specgguf run` drafts through the text"
                " (the cross-vocabulary drafter), in the mode measured faster here: its own text, re-encoded by the"
                f" verifier, or only the {report.overlap:.0%} of the verifier's tokens that a draft token spells the"
                " same (see `cross mode`)"
            )
        )
    else:
        console.print(
            Text("✗ these cannot be paired: ", style="red bold")
            + Text(f"{len(failed)} of {len(report.findings)} rules fail ({', '.join(failed)})")
            + Text(", and no verifier token has a draft token with the same text")
        )
    for line in report.suggestions:
        console.print(Text("→ " + terminal_safe(line)))
