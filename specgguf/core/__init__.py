"""The algorithm, numpy only: model (the protocol), sampling (the acceptance rule), block_verify (the
block rule for a chain), drafting (what drafters share; when a draft model reads a long context), one
drafter per module (model_drafter, ngram_drafter, cross_drafter: a draft of another vocabulary through
text, over vocab_map; string_drafter: its own text re-encoded by the verifier) and drafters (the table
of kinds, with the hybrid that picks between two of them), ngram_cache (its file: ngram_store), engine
(the loop), events (a step's verifier batch, what it yields, and the totals over them), kpolicy (adaptive K) and
acceptance_counts (what its steps teach it), repeatable (a K policy timed by fixed costs: serve
--deterministic), rounds (a round's price under serve --parallel: its line, shared costs and K),
lane_policy (a lane's K policy among the live requests', reading its lane's sequences), costs,
calibration (greedy runs that measure a draft); constraint (grammars under speculation) and
grammar_walk (its masks along a step), json_digits (a JSON schema's numbers bounded in digits),
forced_drafter (a grammar's forced tokens as free drafts), lazy_grammar (tool calls: a grammar from an
opener on); hot_vocab (a hot-vocabulary draft seen over the whole vocabulary)."""
