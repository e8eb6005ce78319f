"""Credentials never printed: storage options whose secret values are masked in every repr, and the redaction of those
values from error messages and log records (in shard and directory processes, and the client's own log lines)."""
from __future__ import annotations

import logging
import traceback
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

MASK = "***"
# A storage option whose name holds one of these is a credential (aws_access_key_id, aws_secret_access_key,
# aws_session_token, google_service_account_key, azure_storage_account_key, azure_storage_sas_token, ...).
SECRET_WORDS = ("secret", "key", "token", "password", "credential", "sas", "signature")
# Values shorter than this are not searched for in texts (a one-letter "secret" would mask every word).
_MIN_SECRET_LEN = 4


def is_secret_option(name: str) -> bool:
    """True when a storage option of this name holds a credential."""
    lowered = name.lower()
    return any(word in lowered for word in SECRET_WORDS)


class StorageOptions(Mapping[str, str]):
    """LanceDB's storage options (aws_endpoint, aws_region, keys, allow_http, ...) whose credentials never show:
    repr and str print them as ***; plain() gives the dict LanceDB takes."""

    __slots__ = ("_options",)

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        self._options = dict(options or {})

    def __getitem__(self, name: str) -> str:
        return self._options[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._options)

    def __len__(self) -> int:
        return len(self._options)

    def plain(self) -> dict[str, str]:
        """The options as LanceDB takes them (credentials included: never print this)."""
        return dict(self._options)

    def shown(self) -> dict[str, str]:
        """The options with every credential replaced by ***: what status and messages print."""
        return {k: (MASK if is_secret_option(k) else v) for k, v in self._options.items()}

    def secrets(self) -> tuple[str, ...]:
        """The credential values, for redact()."""
        return tuple(v for k, v in self._options.items() if is_secret_option(k) and len(v) >= _MIN_SECRET_LEN)

    def __repr__(self) -> str:
        return f"StorageOptions({self.shown()!r})"

    __str__ = __repr__

    def __reduce__(self):
        return (StorageOptions, (self._options,))


def redact(text: str, secrets: Iterable[str]) -> str:
    """text with every secret value replaced by ***."""
    for secret in secrets:
        if secret and secret in text:
            text = text.replace(secret, MASK)
    return text


def _redacted_record(record: logging.LogRecord, secrets: tuple[str, ...]) -> logging.LogRecord:
    """The record with the secrets taken out of its message and of its traceback (formatted here, once)."""
    try:
        message = record.getMessage()
    except Exception:  # a bad format string is the logging module's to report
        return record
    cleaned = redact(message, secrets)
    if cleaned != message:
        record.msg, record.args = cleaned, None
    if record.exc_info and record.exc_info[0] is not None:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        record.exc_text = redact(text, secrets)
        record.exc_info = None
    return record


class RedactingFilter(logging.Filter):
    """A logging filter that takes the secrets out of every record it sees (installed on a logger or handler)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = tuple(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        """Takes the secrets out of the record; keeps every record."""
        _redacted_record(record, self.secrets)
        return True


_installed_secrets: set[str] = set()


def redact_process_logs(secrets: Iterable[str]) -> None:
    """In a process of the cluster's own (a shard, the directory): every log record, of any logger, Ray's and
    LanceDB's included, loses these secrets when it is made."""
    new = {s for s in secrets if s} - _installed_secrets
    if not new:
        return
    first = not _installed_secrets
    _installed_secrets.update(new)
    if not first:
        return
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return _redacted_record(make(*args, **kwargs), tuple(_installed_secrets))

    logging.setLogRecordFactory(factory)


def redact_package_logs(secrets: Iterable[str]) -> RedactingFilter:
    """In a client's process (the application's own): the `tiered_recall` logger's records lose these secrets; the
    application's other logging is left as it was."""
    log_filter = RedactingFilter(secrets)
    logger = logging.getLogger("tiered_recall")
    logger.addFilter(log_filter)
    for name, other in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("tiered_recall.") and isinstance(other, logging.Logger):
            other.addFilter(log_filter)
    return log_filter
