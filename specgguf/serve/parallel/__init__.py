"""Several clients at once (`serve --parallel N`), in one room: lanes (the live sequences: which lane a
request takes, an editor's completion first, giving way between steps) and sizing (how many fit in
memory). A lane's K policy among the live requests' is core's (core/lane_policy.py, priced by
core/rounds.py over the `KPolicy` protocol): a step calls nothing in serve."""
