"""Several clients at once (`serve --parallel N`), in one room: lanes (the live sequences: which lane a
request takes, an editor's completion first, giving way), round_policy (a lane's K policy among the
live requests', priced by core/rounds.py over the `KPolicy` protocol) and sizing (how many fit in
memory)."""
