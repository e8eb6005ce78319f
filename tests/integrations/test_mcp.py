"""`tiered-recall mcp` through the MCP SDK's own client over stdio: the tools and their schemas, add / search / get /
delete / list namespaces with ids as strings too, the store's errors as tool errors after which the server keeps
serving, the store closed when the client goes (stdin closed, or SIGTERM), and the command without the mcp extra."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from mcp import Client, ClientSession, StdioServerParameters  # the mcp extra, which the test extra installs
from mcp.client.stdio import stdio_client
from typer.testing import CliRunner

from tiered_recall import TieredMemory
from tiered_recall.cli import app

pytestmark = [pytest.mark.lancedb, pytest.mark.timeout(180)]

# The installed console script: `python -m` from the checkout would import the source tree instead.
CLI = str(Path(sys.executable).parent / "tiered-recall")
TOOLS = {"add_memories", "search_memories", "get_memories", "delete_memories", "list_namespaces"}


def server_params(store: Path, *options: str) -> StdioServerParameters:
    """The server as an MCP client would start it, on a store of its own and without a hot tier (no sidecar to
    leave behind). The SDK passes on only a few environment variables by default; TIERED_RECALL_BIN_DIR and the
    like must reach the server too. COLUMNS: the server's log lines unwrapped, so that one can be looked for."""
    return StdioServerParameters(command=CLI, args=["mcp", "--store", str(store), "--device", "none", *options],
                                 env={**os.environ, "COLUMNS": "500"})


@asynccontextmanager
async def session_on(store: Path, errlog, *options: str):
    """A ClientSession over stdio after the initialize handshake (what today's MCP clients do)."""
    async with stdio_client(server_params(store, *options), errlog=errlog) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            assert init.server_info.name == "tiered-recall"
            await session.list_tools()  # so that the client checks each result against the tool's output schema
            yield session


async def ok(session, tool: str, /, **arguments) -> dict:
    """A tool call that must succeed: its structured result, which the text content repeats as JSON."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


async def refused(session, tool: str, /, **arguments) -> str:
    """A tool call that must come back as a tool error (not a protocol error): its message."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result
    return result.content[0].text


@pytest.mark.asyncio
async def test_the_tools_have_typed_schemas_with_descriptions(tmp_path):
    async with Client(server_params(tmp_path / "store")) as client:  # the SDK's high-level client, default mode
        assert "search_memories" in client.instructions
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        # a call in this mode too: an empty store answers with no hits
        empty = await client.call_tool("search_memories", {"query": "anything"})
        assert not empty.is_error and empty.structured_content["hits"] == []
    assert set(tools) == TOOLS
    schemas = {name: tool.input_schema for name, tool in tools.items()}
    for name, tool in tools.items():
        assert tool.description and tool.title and tool.output_schema, name
        for field, spec in schemas[name]["properties"].items():
            assert spec.get("description"), f"{name}.{field} has no description"

    add = schemas["add_memories"]
    assert add["required"] == ["texts"]
    assert add["properties"]["texts"]["type"] == "array"
    assert add["properties"]["texts"]["items"] == {"type": "string"}
    assert add["properties"]["namespace"]["default"] == "default"
    assert {"type": "object", "additionalProperties": True} in add["properties"]["metadata"]["anyOf"]
    search = schemas["search_memories"]
    assert search["required"] == ["query"]
    assert search["properties"]["k"] == {**search["properties"]["k"], "type": "integer", "minimum": 1,
                                         "maximum": 256, "default": 10}
    assert search["properties"]["hybrid"]["type"] == "boolean"
    for name in ("get_memories", "delete_memories"):
        ids = schemas[name]["properties"]["ids"]
        assert schemas[name]["required"] == ["ids"] and ids["type"] == "array"
        assert {arm["type"] for arm in ids["items"]["anyOf"]} == {"integer", "string"}  # ids as digits too
    assert "required" not in schemas["list_namespaces"]

    assert tools["search_memories"].annotations.read_only_hint is True
    assert tools["delete_memories"].annotations.destructive_hint is True
    hit = tools["search_memories"].output_schema["$defs"]["FoundMemory"]["properties"]
    assert {"id", "id_str", "text", "score", "tier", "namespace", "role", "session", "created_at",
            "metadata"} <= set(hit)


@pytest.mark.asyncio
async def test_add_search_get_delete_and_list_namespaces(tmp_path):
    store = tmp_path / "store"
    log = tmp_path / "server.log"
    with open(log, "w") as errlog:
        async with session_on(store, errlog, "--log-level", "info") as session:  # to see the store closed
            added = await ok(session, "add_memories", texts=["My cat is called Miso", "I work on churn metrics",
                                                             "I am allergic to peanuts"],
                             namespace="alice", role="user", session="s1", metadata={"source": "chat"})
            assert added["namespace"] == "alice" and len(added["ids"]) == 3
            assert added["id_strs"] == [str(i) for i in added["ids"]]
            cat, work, _ = added["id_strs"]
            reply = await ok(session, "add_memories", texts=["Noted: your cat is Miso"], namespace="alice",
                             role="assistant", session="s1")
            await ok(session, "add_memories", texts=["Bob likes sailing"], namespace="bob")

            found = await ok(session, "search_memories", query="what is the name of my cat?", namespace="alice",
                             k=2, where="role = 'user'")
            assert [h["text"] for h in found["hits"]][0] == "My cat is called Miso"
            assert len(found["hits"]) == 2 and {h["role"] for h in found["hits"]} == {"user"}
            top = found["hits"][0]
            assert top["id_str"] == cat and top["id"] == int(cat) and top["tier"] == "cold"  # device none
            assert top["metadata"] == {"source": "chat"} and top["session"] == "s1" and top["namespace"] == "alice"
            assert top["score"] > found["hits"][1]["score"] and found["note"] is None
            everywhere = await ok(session, "search_memories", query="sailing boats", k=1)
            assert everywhere["hits"][0]["text"] == "Bob likes sailing"
            keywords = await ok(session, "search_memories", query="peanuts", namespace="alice", k=1, hybrid=True)
            assert keywords["hits"][0]["text"] == "I am allergic to peanuts" and keywords["rule"] == "hybrid"
            typo = await ok(session, "search_memories", query="cat", namespace="alcie")
            assert typo["hits"] == []
            assert typo["note"] == "no memories in namespace 'alcie'; namespaces in this store: alice (4), bob (1)"

            got = await ok(session, "get_memories", ids=[work, int(cat)])  # a string and an integer
            assert [m["id_str"] for m in got["memories"]] == [work, cat]
            assert got["memories"][1]["text"] == "My cat is called Miso" and got["memories"][1]["role"] == "user"

            # own ids, as digit strings up to 2**63 - 1: exact, and an existing one is replaced
            big = str(2**63 - 1)
            own = await ok(session, "add_memories", texts=["Ana is vegetarian", "The review is on the 21st"],
                           namespace="alice", ids=[big, 7])
            assert own["id_strs"] == [big, "7"] and own["ids"] == [2**63 - 1, 7]
            await ok(session, "add_memories", texts=["Ana is vegan now"], namespace="alice", ids=[big])
            assert (await ok(session, "get_memories", ids=[big]))["memories"][0]["text"] == "Ana is vegan now"

            listed = await ok(session, "list_namespaces")
            assert {n["namespace"]: n["memories"] for n in listed["namespaces"]} == {"alice": 6, "bob": 1}
            assert listed["memories"] == 7 and all(n["hot"] == 0 for n in listed["namespaces"])

            gone = await ok(session, "delete_memories", ids=[reply["id_strs"][0], "12345"])
            assert gone == {"deleted": 1, "asked": 2}  # an id with no memory is skipped
            assert await refused(session, "get_memories", ids=reply["id_strs"]) == (
                f"no memory with id {reply['id_strs'][0]}")
            listed = await ok(session, "list_namespaces")
            assert {n["namespace"]: n["memories"] for n in listed["namespaces"]} == {"alice": 5, "bob": 1}

    # the client closed stdin: the server closed the store and exited; what it stored is there for the next open
    assert f"closed the store at {store.resolve()}" in log.read_text()
    with TieredMemory(store, device="none") as memory:
        assert memory.count("alice") == 5 and memory.get([2**63 - 1])[0].text == "Ana is vegan now"


@pytest.mark.asyncio
async def test_errors_are_tool_errors_with_the_stores_message_and_the_server_keeps_serving(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "w") as errlog:
        async with session_on(tmp_path / "store", errlog) as session:
            kept = (await ok(session, "add_memories", texts=["My cat is called Miso"], namespace="alice"))["id_strs"]

            assert await refused(session, "get_memories", ids=["12345"]) == "no memory with id 12345"
            partly = await session.call_tool("get_memories", {"ids": [kept[0], 999]})
            assert partly.is_error and partly.content[0].text == "no memory with id 999"
            assert json.loads(partly.content[1].text)["memories"][0]["id_str"] == kept[0]  # the ones found come too

            for k in (0, 1000):
                assert await refused(session, "search_memories", query="cat", k=k) == (
                    f"k must be an int in 1..256, got {k}")
            bad_where = await refused(session, "search_memories", query="cat", where="no_such_column = 1")
            assert bad_where.startswith("the where filter 'no_such_column = 1' is not valid LanceDB SQL"), bad_where
            assert await refused(session, "search_memories", query="   ") == "the query is empty: search for some text"
            assert await refused(session, "add_memories", texts=[]) == (
                "texts is empty: give at least one text to remember")
            assert await refused(session, "add_memories", texts=["  "]) == (
                "texts[0] is empty: give it content or drop it")
            assert await refused(session, "add_memories", texts=["x"], namespace="") == (
                "namespace must be a non-empty string, e.g. namespace='default'")
            assert await refused(session, "add_memories", texts=["a", "b"], ids=[1]) == (
                "ids has 1 values for 2 texts: give one id per text, or none")
            assert await refused(session, "get_memories", ids=["12x"]) == (
                "ids must be integers or strings of digits, got '12x'")
            assert await refused(session, "delete_memories", ids=[2**63]) == (
                "ids must be between 0 and 2**63 - 1, got 9223372036854775808")
            assert await refused(session, "delete_memories", ids=[]) == "ids is empty: give at least one memory id"
            # the wrong type for an argument: the SDK's own validation, naming the argument
            wrong_type = await refused(session, "search_memories", query="cat", k="many")
            assert "k" in wrong_type and "valid integer" in wrong_type, wrong_type

            # still serving, and nothing was written by the refused calls
            found = await ok(session, "search_memories", query="my pet", k=5)
            assert [h["id_str"] for h in found["hits"]] == kept
            listed = await ok(session, "list_namespaces")
            assert listed["memories"] == 1
    assert "Traceback" not in log.read_text(), log.read_text()


@pytest.mark.asyncio
async def test_the_server_is_silent_on_stderr_by_default_and_logs_to_a_file_when_asked(tmp_path):
    """A client shows a stdio server's stderr to its user: by default only warnings and errors go there."""
    closed = f"closed the store at {(tmp_path / 'store').resolve()}"
    for options, on_stderr in (((), False), (("--log-level", "info", "--log-file", str(tmp_path / "mcp.log")), False),
                               (("--log-level", "info"), True)):
        stderr = tmp_path / "stderr.log"
        with open(stderr, "w") as errlog:
            async with session_on(tmp_path / "store", errlog, *options) as session:
                await ok(session, "add_memories", texts=["My cat is called Miso"], namespace="alice")
                assert (await ok(session, "search_memories", query="cat", namespace="alice"))["hits"]
                await refused(session, "get_memories", ids=["12345"])  # a tool error is the client's to show
        assert (closed in stderr.read_text()) if on_stderr else stderr.read_text() == "", (options, stderr.read_text())
    assert closed in (tmp_path / "mcp.log").read_text()


def test_sigterm_closes_the_store_and_exits(tmp_path):
    store = tmp_path / "store"
    proc = subprocess.Popen([CLI, "mcp", "--store", str(store), "--device", "none", "--log-level", "info"],
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "500"})
    try:
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}})
            + "\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())  # serving: the store is open
        assert answer["result"]["serverInfo"]["name"] == "tiered-recall"
        proc.send_signal(signal.SIGTERM)  # with stdin still open: what a client does when the server lingers
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert f"closed the store at {store.resolve()}" in err and "Traceback" not in err, err


def test_the_command_has_help_and_names_the_extra_when_mcp_is_missing(tmp_path, monkeypatch):
    runner = CliRunner()
    shown = runner.invoke(app, ["mcp", "--help"])
    assert shown.exit_code == 0
    for words in ("MCP client", "--store FOLDER", "--device", "--embedder NAME", "docs/integrations/mcp.md",
                  "--log-level", "--log-file FILE"):
        assert words in shown.stdout, words
    assert "<path>" not in shown.stdout and "<str>" not in shown.stdout

    for name in [name for name in sys.modules if name == "mcp" or name.startswith("mcp.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "tiered_recall.integrations.mcp_server", raising=False)
    missing = runner.invoke(app, ["mcp", "--store", str(tmp_path / "store"), "--device", "none"])
    assert missing.exit_code == 2
    said = " ".join(missing.stderr.split())  # as one line: the console wraps at its width
    assert said.startswith("error: the MCP server needs the mcp package") and said.endswith(
        'pip install "tiered-recall[mcp]"'), said
    assert not (tmp_path / "store").exists()  # refused before the store was opened
