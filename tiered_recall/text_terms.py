"""The terms a text is matched on by words: the cold tier's BM25 index and the retrieval stages' keyword match both
read texts through tokenize, so a word counts the same in either."""
from __future__ import annotations

import re

_TOKEN = re.compile(r"[0-9a-z]+")
# bm25s's English list (the scikit-learn-derived short list) plus a few conversational fillers.
_STOPWORDS = frozenset("""a an and are as at be but by for if in into is it no not of on or such that the their then
there these they this to was will with i you he she we me my your his her our its am im do did does""".split())


def _stem(token: str) -> str:
    # A light plural stemmer: enough to match "dogs"/"dog" and "hobbies"/"hobby" without a stemming library.
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    if len(token) > 3 and token.endswith("s") and not token.endswith(("ss", "us", "is")):
        return token[:-1]
    return token


def tokenize(text: str) -> list[str]:
    """The terms of a text: runs of [0-9a-z] in the lower-cased text, stopwords dropped, plurals stemmed lightly."""
    return [_stem(t) for t in _TOKEN.findall(text.lower()) if t not in _STOPWORDS]
