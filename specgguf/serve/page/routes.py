"""`GET /`: a chat page over the server's own `/v1/chat/completions`, shipped as static files.

index.html, page.css, the page's scripts and the vendored libraries (vendor/README.md: marked,
DOMPurify, highlight.js, pinned and licensed) are package data (no build step): read once when the
app is made and answered from memory. Only the paths in FILES exist; the folder is never listed or
served as a whole; `--no-webui` leaves them all out (app.py). The files need no key (they hold
nothing but the page): the page asks for the key and sends it with its API calls. Its
Content-Security-Policy lets it load only its own files and talk only to this server, so even text
that slipped past DOMPurify into the document could not run.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

FILES = {  # path -> (file in this package, media type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/page/page.css": ("page.css", "text/css; charset=utf-8"),
    **{
        f"/page/{name}": (name, "text/javascript; charset=utf-8")
        for name in ("store.js", "render.js", "metrics.js", "page.js")
    },
    **{
        f"/page/vendor/{name}": (f"vendor/{name}", "text/javascript; charset=utf-8")
        for name in ("marked.min.js", "purify.min.js", "highlight.min.js")
    },
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:;"
        " base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # a new version of specgguf shows its new page
}


def add_routes(app: FastAPI) -> None:
    folder = resources.files(__package__)
    for path, (name, media_type) in FILES.items():
        app.add_api_route(path, _answer(folder.joinpath(*name.split("/")).read_bytes(), media_type), methods=["GET"])


def _answer(content: bytes, media_type: str):
    """An endpoint with no parameters (FastAPI would read a parameter from the query string)."""

    async def page_file() -> Response:
        return Response(content, media_type=media_type, headers=HEADERS)

    return page_file
