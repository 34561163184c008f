"""The algorithm, numpy only: model (the protocol), sampling (the acceptance rule), drafting, one drafter
per module (model_drafter, ngram_drafter, hybrid_drafter) and drafters (the table of kinds), ngram_cache,
engine (the loop), kpolicy (adaptive K), stats, costs; constraint (grammars under speculation), forced_drafter
(a grammar's forced tokens as free drafts), lazy_grammar (tool calls: a grammar from an opener on)."""
