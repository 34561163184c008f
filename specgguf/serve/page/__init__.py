"""The page at `/`: a chat in the browser over the server's own API (routes.py serves its files)."""
