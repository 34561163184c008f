"""Drafts for a verifier, from what is on this machine to the one a run loads: found (a draft of the
verifier's vocabulary among the local models, for `-m` alone and `pairs --local`), made (the draft
re-quantized for this CPU, measured, chosen: `load_chosen`, a `DraftChoice`), cross_vocab (a pair of
two vocabularies: its map, kept and checked, and what its drafter reads) and cross_search (drafts of
another vocabulary found, ranked and measured against n-gram drafts before adoption, each mode a
trial). The command line (`-m` alone: cli/options.py) and prepare.py ask it for a run's draft;
`pairs --local`, `check` and `bench` show what it found, made and kept. cross_search is its top
floor; the other three import none of each other (`make lint`)."""
