"""The OpenAPI document of the HTTP API, the same whatever store the app serves: `python -m tiered_recall.http.openapi
docs/openapi.json` writes it (a test checks that the served document equals the committed one)."""
from __future__ import annotations

import json
import sys
from typing import Any

from .app import create_app


def openapi_document() -> dict[str, Any]:
    """The document /openapi.json serves. The app is built over no store: making the document calls none of its
    methods."""
    return create_app(None, metrics=None).openapi()


def render(document: dict[str, Any]) -> str:
    """The document as the committed file holds it: indented, keys in the app's order, a newline at the end."""
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    """Writes the document to argv[1], or to stdout."""
    text = render(openapi_document())
    if len(argv) > 1:
        with open(argv[1], "w", encoding="utf-8") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
