"""How a message names an option as its caller writes it: a Python keyword (read_only=True, text_field=...) or a
command-line flag (--read-only, --text-field FIELD), so that an error names a fix the caller can type.

The caller's spelling of an option's name comes from a map such as TieredMemory's option_names; a name that starts
with "--" is a flag, any other a keyword.
"""
from __future__ import annotations

from typing import Any


def is_flag(spelled: str) -> bool:
    """Whether an option's spelled name is a command-line flag (--read-only) rather than a Python keyword."""
    return spelled.startswith("--")


def option_set(spelled: str, value: Any) -> str:
    """The option given a value: read_only=True / --read-only, device='none' / --device none."""
    if not is_flag(spelled):
        return f"{spelled}={value!r}"
    if value is True:
        return spelled
    return f"{spelled} {value}"


def option_to_fill(spelled: str, placeholder: str) -> str:
    """The option with a value left for the caller: text_field=... / --text-field FIELD."""
    return f"{spelled} {placeholder}" if is_flag(spelled) else f"{spelled}=..."
