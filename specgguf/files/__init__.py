"""Model files: registry (models.yaml), resolve (a path, a pair, a pulled file), hub, transfer, assets
(PyPI chunk packages), paths (validated), stamps (SHA-256 stamps)."""
