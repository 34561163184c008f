"""The server's APIs, one entry each."""
