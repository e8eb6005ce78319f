"""Errors in the caller's own spelling: the command line names its flags (--text-field FIELD, --read-only), Python
its keywords (text_field=..., read_only=True), never both at once; and advice that fits the case (a store path that
is a file, or that cannot be made, is not helped by --read-only)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiered_recall.cli import app
from tiered_recall.errors import InvalidInput

runner = CliRunner()
FIXTURES = Path(__file__).parents[1] / "ingest" / "fixtures" / "ingest"
PYTHON_SPELLING = re.compile(r"\(--|\w=\.\.\.|\w=True|\w='|_field|skip_bad|keep_system|read_only")


def cli(*args: str):
    return runner.invoke(app, list(args))


def error_of(result) -> str:
    assert result.exit_code == 2, result.output
    return " ".join(result.stderr.split())  # the console wraps long lines


def in_store(path: Path, *args: str) -> tuple[str, ...]:
    return (*args, "--store", str(path), "--device", "none", "--preset", "fast")


@pytest.fixture
def odd_log(tmp_path) -> Path:
    log = tmp_path / "odd.jsonl"
    log.write_text(json.dumps({"speaker": "me", "words": "hello"}) + "\n" + json.dumps({"speaker": "me"}) + "\n")
    return log


def test_ingest_errors_name_the_flags(tmp_path, odd_log):
    store = tmp_path / "store"
    cases = [
        ((str(odd_log),), "cannot tell the format from the first record (an object with keys [speaker, words]); name "
                          "the format with --format FORMAT (one of jsonl, openai, sharegpt, locomo, chatgpt, claude, "
                          "conversation), or map the text field with --text-field FIELD"),
        ((str(odd_log), "--text-field", "words"), "odd.jsonl:2: jsonl record: expected a message with a text field "
                                                  "(words), got an object with keys [speaker]; map the field with "
                                                  "--text-field FIELD; fix the record or pass --skip-bad"),
        ((str(odd_log), "--batch-size", "0"), "--batch-size must be a positive integer, got 0"),
        ((str(odd_log), "--context-turns", "99"), "--context-turns must be an integer from 0 to 16, got 99"),
        ((str(odd_log), "--format", "jsonl", "--turns-field", "x"),
         "--turns-field reads one conversation per record: use --format auto or --format conversation, not 'jsonl'"),
        ((str(odd_log), "--format", "conversation"),
         "--format conversation needs the field holding each record's list of turns: --turns-field FIELD"),
        ((str(odd_log), "-n", ""), "-n/--namespace must be a non-empty name, e.g. -n alice"),
    ]
    for args, expected in cases:
        message = error_of(cli(*in_store(store, "ingest", *args)))
        assert expected in message, message
        assert not PYTHON_SPELLING.search(message), message


def test_a_skip_reason_in_the_summary_names_the_flag(tmp_path):
    result = cli(*in_store(tmp_path / "store", "ingest", str(FIXTURES / "openai.jsonl"), "--json"))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["skipped_reasons"] == {"system message (--keep-system stores them)": 1}


def test_a_store_path_that_is_a_file_or_cannot_be_made(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a store")
    message = error_of(cli(*in_store(a_file, "list")))
    assert message == (f"error: {a_file} is a file, not a store folder: pass a folder (--store FOLDER; a new store is "
                       "made in one that does not exist yet)")
    under_a_file = a_file / "store"
    message = error_of(cli(*in_store(under_a_file, "list")))
    assert message == (f"error: cannot make the store folder {under_a_file} (Not a directory): pass a folder you can "
                       "write (--store FOLDER)")
    missing = tmp_path / "nothing-here"
    message = error_of(cli("list", "--read-only", "--store", str(missing)))
    assert message == f"error: no store at {missing}: a read-only store must exist (open it writable once)"
    assert not missing.exists()  # a read-only open makes nothing

    from tiered_recall import TieredMemory

    with pytest.raises(InvalidInput, match=r"is a file, not a store folder: pass a folder \(path=\.\.\.; a new"):
        TieredMemory(a_file, device="none")


def test_read_commands_take_read_only(tmp_path):
    store = tmp_path / "store"
    assert cli(*in_store(store, "add", "Ana is vegan now", "-n", "alice")).exit_code == 0
    for args in (("list", "--json"), ("export",), ("stats",), ("search", "Ana", "-n", "alice", "--json")):
        result = cli(*args, "--read-only", "--store", str(store))
        assert result.exit_code == 0, (args, result.output)
    listed = cli("list", "--json", "--read-only", "--store", str(store))
    assert json.loads(listed.stdout)["alice"]["memories"] == 1


def test_search_and_add_errors_name_the_flags(tmp_path):
    store = tmp_path / "store"
    assert cli(*in_store(store, "add", "Ana is vegan now")).exit_code == 0
    cases = [
        (("search", "x", "-k", "0"), "error: -k must be from 1 to 256, got 0"),
        (("search", "x", "--where", " "), "error: --where must be a SQL filter, e.g. --where \"role = 'user'\""),
        (("search", "x", "-n", ""), "error: -n/--namespace must be a non-empty name, e.g. -n alice"),
        (("add", "a", "b", "--id", "1"), "error: --id is given once per text: 2 text(s) but 1 --id"),
        (("add", "a", "--hot-capacity", "0"), "error: --hot-capacity must be a positive number of rows, got 0"),
        (("search", "x", "--where", "role = = 'user'"),
         "error: the where filter \"role = = 'user'\" is not valid LanceDB SQL over the columns id, namespace, "
         "session, role, text, created_at, metadata: Expected: an expression, found: ="),
        (("search", "x", "--where", "role = 'user"),
         "error: the where filter \"role = 'user\" leaves a ' quote open: close it (write a quote inside a string "
         "twice: 'O''Brien')"),
    ]
    for args, expected in cases:
        assert error_of(cli(*in_store(store, *args))) == expected
