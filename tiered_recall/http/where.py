"""The one check the HTTP layer makes of a `where` filter before the store reads it: the store puts the filter inside
parentheses beside its own namespace condition, so a filter whose parentheses do not balance (outside its quoted
strings and names), or that opens a comment, could reach past that condition. LanceDB checks the SQL itself."""
from __future__ import annotations

from .problems import BadInput


def check_where(where: str) -> None:
    """BadInput when the filter's parentheses do not balance outside quotes, or when it holds a SQL comment."""
    depth, quote, i = 0, None, 0
    while i < len(where):
        c = where[i]
        if quote is not None:
            if c == quote:
                if where[i + 1:i + 2] == quote:  # a doubled quote stands for itself
                    i += 1
                else:
                    quote = None
        elif c in "'\"`":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                raise BadInput("where closes a parenthesis it did not open: balance its parentheses")
        elif where.startswith(("--", "/*"), i):
            raise BadInput("where holds a SQL comment (-- or /*): write the filter without one")
        i += 1
    if quote is not None:
        raise BadInput(f"where leaves a {quote} quote open: close it (write a quote inside a string twice: 'O''Brien')")
    if depth:
        raise BadInput("where leaves a parenthesis open: balance its parentheses")
