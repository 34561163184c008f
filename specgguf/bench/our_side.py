"""Our side of `bench --vs-llama-cpp`: the pair loaded only while our columns run.

llama.cpp's programs run as fresh processes, each alone on the machine as a user runs them. Ours used to
run in the bench's own process with both models loaded the whole time, llama.cpp's runs included, and on
some machines a process that merely holds a model loaded makes another process's decoding of it faster.
Seen on a 2-vCPU Intel Xeon VM (docs/benchmarks.md, 2026-12-06): llama-completion decoded a token in
55.7 ms beside an idle process that had loaded the verifier with llama.cpp's repacked weights (63.4 ms
beside one that had loaded it without repacking), 60.4-62.2 ms alone; `specgguf run -k 0` made 128 tokens
in 7.1 s beside it, 8.0-8.2 s alone. So llama.cpp's columns ran faster than either program alone does
and ours at their alone speed: our plain decoding read 0.93-0.95x llama-completion's on all 26 suite
prompts where, alone, the two are as fast.

Now our models are closed while llama.cpp's columns run, and loaded again (a second or two, left out of
the numbers, the measured costs kept) before ours: each side runs alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ..drafts.made import DraftChoice, load_chosen, open_draft
from ..llama.variants import ORIGINAL_VARIANT
from ..prepare import MEASURING, DraftOptions, LoadOptions, Prepared, prepare
from .command import BenchTarget


@dataclass
class OurSide:
    """`open()` gives (the pair with the user's draft, for fixed K; the pair as `run` loads it, for the
    default), loading them if closed; `close()` frees every model they hold."""

    target: BenchTarget
    load: LoadOptions
    progress: Callable[[str | None], None]
    _open: tuple[Prepared, Prepared] | None = None
    # The pair as last loaded (closed or not): a later load keeps its costs, measured or read by the runs so
    # far (Prepared fills them in as it goes), and the default's draft choice.
    _last: tuple[Prepared, Prepared] | None = None

    def open(self) -> tuple[Prepared, Prepared]:
        if self._open is None:
            self._open = self._last = self._load()
        return self._open

    @property
    def draft_choice(self) -> DraftChoice | None:
        """The default's draft and why, as the first load chose it (None before any load)."""
        return None if self._last is None else self._last[1].draft_choice

    def close(self) -> None:
        if self._open is None:
            return
        prepared, default = self._open
        self._open = None
        for model in {id(m): m for m in (prepared.verifier, prepared.draft, default.draft) if m is not None}.values():
            model.close()

    def _load(self) -> tuple[Prepared, Prepared]:
        # llama.cpp's columns and our fixed-K ones draft with the user's file; our default with the
        # draft made for this machine, as `run` does (the same file when that measured best here).
        given = dataclasses.replace(self.load, draft_variant=ORIGINAL_VARIANT)
        if self._last is None:
            self.progress(f"loading {self.target.label}")
            prepared = prepare(self.target.pair, given, DraftOptions(), on_measure=lambda: self.progress(MEASURING))
            return prepared, self._default_side(prepared)
        last, last_default = self._last
        prepared = prepare(self.target.pair, given, DraftOptions(), measure_now=False)
        prepared = dataclasses.replace(prepared, _costs=last._costs, _read=last._read)
        choice = last_default.draft_choice
        if last_default.draft is last.draft or choice is None or prepared.draft is None:
            return prepared, dataclasses.replace(prepared, draft_choice=choice)
        draft = open_draft(choice.path, self.load.draft_settings)
        return prepared, dataclasses.replace(
            prepared, draft=draft, draft_choice=choice, _costs=last_default._costs, _read=last_default._read
        )

    def _default_side(self, prepared: Prepared) -> Prepared:
        """The pair as `run` loads it: the same verifier, the draft --draft-variant chooses."""
        if prepared.draft is None:
            return prepared
        draft, choice = load_chosen(
            prepared.verifier,
            prepared.draft,
            self.load.draft_variant,
            settings=self.load.draft_settings,
            announce=self.progress,
        )
        if draft is prepared.draft:
            return dataclasses.replace(prepared, draft_choice=choice)
        return dataclasses.replace(prepared, draft=draft, draft_choice=choice, _costs=None, _read=None)
