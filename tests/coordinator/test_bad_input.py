"""Bad input everywhere (issue 8, part 4): every public call and CLI command refuses wrong types, wrong dims,
empty and huge inputs, NaN/inf, non-UTF-8 text, unknown namespaces and flags with a clear error that names
the fix, and writes nothing."""
from __future__ import annotations

import math
import uuid

import numpy as np
import pytest

from tiered_recall.errors import InvalidInput, TieredRecallError

DIM = 8
pytestmark = pytest.mark.lancedb


def _unit(n: int = 1) -> np.ndarray:
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _clear(message: str) -> bool:
    """A clear error: says what is wrong, in words, and what to do (at least a hint of it)."""
    return len(message) >= 20 and "Traceback" not in message


@pytest.fixture(scope="module")
def memory(tmp_path_factory):
    from tiered_recall import TieredMemory

    mem = TieredMemory(tmp_path_factory.mktemp("bad") / "store", dim=DIM, embedder=lambda texts: _embed(texts),
                       device="none")
    mem.add(["first memory", "second memory"], namespace="default")
    yield mem
    mem.close()


def _embed(texts):
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, t in enumerate(texts):
        out[i, hash(t) % DIM] = 1.0
        out[i, (hash(t) // DIM) % DIM] += 0.5
    return out


NAN_VECTORS = np.full((1, DIM), np.nan, dtype=np.float32)
INF_VECTORS = np.full((1, DIM), np.inf, dtype=np.float32)

ADD_CASES = {
    "texts int": dict(texts=42),
    "texts dict": dict(texts={"a": 1}),
    "texts list of int": dict(texts=[1, 2]),
    "texts bytes": dict(texts=b"\xff\xfe not utf-8"),
    "texts list of bytes": dict(texts=[b"\xff\xfe"]),
    "texts lone surrogate": dict(texts=["bad \udcff text"]),
    "texts empty list": dict(texts=[]),
    "texts empty string": dict(texts=[""]),
    "texts whitespace": dict(texts=["   "]),
    "nothing": dict(),
    "vectors wrong dim": dict(vectors=np.ones((1, DIM + 1), dtype=np.float32)),
    "vectors 3-d": dict(vectors=np.ones((1, 1, DIM), dtype=np.float32)),
    "vectors nan": dict(vectors=NAN_VECTORS),
    "vectors inf": dict(vectors=INF_VECTORS),
    "vectors zeros": dict(vectors=np.zeros((1, DIM), dtype=np.float32)),
    "vectors strings": dict(vectors=np.array([["a"] * DIM])),
    "vectors object": dict(vectors=[[object()] * DIM]),
    "vectors empty": dict(vectors=np.empty((0, DIM), dtype=np.float32)),
    "vectors count mismatch": dict(texts=["a", "b"], vectors=_unit(3)),
    "namespace empty": dict(texts=["x"], namespace=""),
    "namespace int": dict(texts=["x"], namespace=5),
    "namespace None": dict(texts=["x"], namespace=None),
    "namespace huge": dict(texts=["x"], namespace="n" * 10_000),
    "namespace surrogate": dict(texts=["x"], namespace="\udcff"),
    "ids wrong length": dict(texts=["a", "b"], ids=[1]),
    "ids negative": dict(texts=["a"], ids=[-5]),
    "ids float": dict(texts=["a"], ids=[1.5]),
    "ids strings": dict(texts=["a"], ids=["1"]),
    "ids repeat": dict(texts=["a", "b"], ids=[7, 7]),
    "ids too big": dict(texts=["a"], ids=[2**64 - 1]),
    "session int": dict(texts=["a"], session=3),
    "role list wrong length": dict(texts=["a"], role=["user", "assistant"]),
    "metadata list": dict(texts=["a"], metadata=[1, 2, 3]),
    "metadata not json": dict(texts=["a"], metadata={"x": object()}),
    "metadata nan": dict(texts=["a"], metadata={"x": math.nan}),
    "created_at nan": dict(texts=["a"], created_at=math.nan),
    "created_at str": dict(texts=["a"], created_at="yesterday"),
    "unknown flag": dict(texts=["a"], hot_only=True),
}


@pytest.mark.parametrize("case", list(ADD_CASES))
def test_add_refuses_bad_input_and_writes_nothing(memory, case):
    before = memory.count()
    with pytest.raises((InvalidInput, TypeError)) as info:
        memory.add(**ADD_CASES[case])
    assert _clear(str(info.value)), str(info.value)
    assert memory.count() == before


SEARCH_CASES = {
    "query None": dict(query=None),
    "query int": dict(query=3),
    "query empty": dict(query=""),
    "query blank": dict(query="   "),
    "query bytes": dict(query=b"\xff\xfe"),
    "query wrong dim": dict(query=np.ones(DIM + 1, dtype=np.float32)),
    "query 2-d": dict(query=np.ones((2, DIM), dtype=np.float32)),
    "query nan": dict(query=np.full(DIM, np.nan, dtype=np.float32)),
    "query inf": dict(query=np.full(DIM, np.inf, dtype=np.float32)),
    "query zeros": dict(query=np.zeros(DIM, dtype=np.float32)),
    "query strings": dict(query=np.array(["a"] * DIM)),
    "k zero": dict(query="x", k=0),
    "k negative": dict(query="x", k=-1),
    "k huge": dict(query="x", k=10**9),
    "k float": dict(query="x", k=2.5),
    "k str": dict(query="x", k="10"),
    "k bool": dict(query="x", k=True),
    "namespace empty": dict(query="x", namespace=""),
    "namespace int": dict(query="x", namespace=3),
    "where empty": dict(query="x", where=""),
    "where int": dict(query="x", where=5),
    "where bad sql": dict(query="x", where="this is not ) sql"),
    "where unknown column": dict(query="x", where="nosuchcolumn = 1"),
    "unknown flag": dict(query="x", exact=True),
}


@pytest.mark.parametrize("case", list(SEARCH_CASES))
def test_search_refuses_bad_input(memory, case):
    kwargs = dict(SEARCH_CASES[case])
    query = kwargs.pop("query")
    with pytest.raises((InvalidInput, TypeError)) as info:
        memory.search(query, **kwargs)
    assert _clear(str(info.value)), str(info.value)


def test_unknown_namespace_is_an_empty_answer_not_an_error(memory):
    assert memory.search("first memory", namespace=f"never-{uuid.uuid4().hex}") == []
    assert memory.count(f"never-{uuid.uuid4().hex}") == 0


@pytest.mark.parametrize("ids", [None, "abc", [1.5], [[1, 2]], {"a": 1}, ["1"]])
def test_delete_and_get_refuse_bad_ids(memory, ids):
    before = memory.count()
    with pytest.raises((InvalidInput, TypeError)) as info:
        memory.delete(ids)
    assert _clear(str(info.value))
    assert memory.count() == before
    with pytest.raises((InvalidInput, TypeError)) as info:
        memory.get(ids)
    assert _clear(str(info.value))


def test_delete_of_unknown_ids_deletes_nothing(memory):
    before = memory.count()
    assert memory.delete([2**62 + 12345]) == 0
    assert memory.count() == before


@pytest.mark.parametrize("namespace", ["", 5, "n" * 10_000])
def test_count_refuses_bad_namespace(memory, namespace):
    with pytest.raises(InvalidInput):
        memory.count(namespace)


CONSTRUCTOR_CASES = {
    "dim zero": dict(dim=0, embedder=None),
    "dim negative": dict(dim=-3, embedder=None),
    "dim str": dict(dim="8", embedder=None),
    "dim float": dict(dim=8.0, embedder=None),
    "dim bool": dict(dim=True, embedder=None),
    "dim huge": dict(dim=10**9, embedder=None),
    "no dim no embedder": dict(embedder=None),
    "unknown embedder": dict(embedder="gpt-17"),
    "embedder int": dict(embedder=5, dim=8),
    "device bogus": dict(device="tpu", dim=8, embedder=None),
    "hot_capacity zero": dict(hot_capacity=0, dim=8, embedder=None),
    "hot_capacity str": dict(hot_capacity="100", dim=8, embedder=None),
    "hot_capacity float": dict(hot_capacity=1.5, dim=8, embedder=None),
    "timeout negative": dict(timeout_s=-1, dim=8, embedder=None),
    "timeout nan": dict(timeout_s=math.nan, dim=8, embedder=None),
    "unknown flag": dict(dim=8, embedder=None, turbo=True),
}


@pytest.mark.parametrize("case", list(CONSTRUCTOR_CASES))
def test_constructor_refuses_bad_arguments_and_creates_nothing(tmp_path, case):
    from tiered_recall import TieredMemory

    store = tmp_path / "store"
    with pytest.raises((InvalidInput, TypeError)) as info:
        TieredMemory(store, device=CONSTRUCTOR_CASES[case].pop("device", "none"), **CONSTRUCTOR_CASES[case])
    assert _clear(str(info.value)), str(info.value)
    assert not store.exists() or not any(store.iterdir()), f"{case}: wrote {list(store.iterdir())}"


@pytest.mark.parametrize("path", [b"\xff\xfe-not-utf8", 42])
def test_constructor_refuses_bad_paths(tmp_path, path):
    from tiered_recall import TieredMemory

    with pytest.raises((InvalidInput, TypeError)):
        TieredMemory(path, dim=8, embedder=None, device="none")


def test_reopening_with_another_dim_is_refused_and_the_store_is_unchanged(tmp_path):
    from tiered_recall import TieredMemory

    store = tmp_path / "store"
    with TieredMemory(store, dim=8, embedder=None, device="none") as m:
        m.add(vectors=_unit(3))
    config = (store / "tiered_recall.json").read_text()
    with pytest.raises(InvalidInput, match="dim=8"):
        TieredMemory(store, dim=16, embedder=None, device="none")
    assert (store / "tiered_recall.json").read_text() == config
    with TieredMemory(store, dim=8, embedder=None, device="none") as m:
        assert m.count() == 3


def test_closed_store_says_so(tmp_path):
    from tiered_recall import TieredMemory

    m = TieredMemory(tmp_path / "s", dim=8, embedder=None, device="none")
    m.close()
    for call in (lambda: m.add(vectors=_unit(1)), lambda: m.search(_unit(1)[0]), lambda: m.count(),
                 lambda: m.delete([1]), lambda: m.get([1]), lambda: m.stats()):
        with pytest.raises(InvalidInput, match="closed"):
            call()


# ---- the hot-tier client ----------------------------------------------------------------------

HOT_SEARCH_CASES = {
    "list": [0.1] * DIM,
    "float64": np.ones(DIM),
    "wrong dim": np.ones(DIM + 1, dtype=np.float32),
    "3-d": np.ones((1, 1, DIM), dtype=np.float32),
    "empty": np.empty((0, DIM), dtype=np.float32),
    "nan": np.full(DIM, np.nan, dtype=np.float32),
    "inf": np.full(DIM, -np.inf, dtype=np.float32),
    "non-contiguous": np.ones((DIM, 2), dtype=np.float32)[:, 0],
    "too many queries": np.ones((100_000, DIM), dtype=np.float32),
}


def test_hot_tier_client_refuses_bad_input(start):
    _, hot = start(dim=DIM, capacity=16)
    hot.upsert([1], _unit(1), 5)
    for case, q in HOT_SEARCH_CASES.items():
        with pytest.raises(InvalidInput) as info:
            hot.search(q, k=1)
        assert _clear(str(info.value)), (case, str(info.value))
    for k in (0, -1, 257, 10**12, 2.5, "3"):
        with pytest.raises((InvalidInput, TypeError)):
            hot.search(_unit(1)[0], k=k)
    bad_upserts = [
        (["a"], _unit(1), 5), ([1], _unit(2), 5), ([1], np.full((1, DIM), np.nan, np.float32), 5),
        ([1], np.ones((1, DIM + 1), np.float32), 5), ([1, 2], _unit(2), [5]), ([[1]], _unit(1), 5),
        ([1], np.array([["x"] * DIM]), 5), ([1], _unit(1), "ns"), (list(range(17)), _unit(17), 5),
    ]
    for ids, vecs, ns in bad_upserts:
        with pytest.raises((InvalidInput, TieredRecallError, TypeError, ValueError)):
            hot.upsert(ids, vecs, ns)
    for bad in (["a"], [[1, 2]], [1.5]):
        with pytest.raises(InvalidInput):
            hot.delete(bad)
        with pytest.raises(InvalidInput):
            hot.contains(bad)
    assert hot.stats()["hot_rows"] == 1 and hot.contains([1]).tolist() == [True]


@pytest.mark.parametrize("kwargs", [
    dict(dim=0, capacity=4), dict(dim=10**6, capacity=4), dict(dim="8", capacity=4), dict(dim=8, capacity=0),
    dict(dim=8, capacity=-1), dict(dim=8, capacity=4, dtype="int8"), dict(dim=8, capacity=4, backend="tpu"),
])
def test_start_sidecar_refuses_bad_arguments(segment_name, kwargs):
    from tiered_recall.hot import segment_path, start_sidecar

    with pytest.raises(InvalidInput):
        start_sidecar(segment_name, **kwargs)
    assert not segment_path(segment_name).exists()


# ---- ingestion --------------------------------------------------------------------------------

INGEST_CASES = {
    "missing file": dict(paths=["/nonexistent/file.jsonl"]),
    "unknown format": dict(format="yaml"),
    "bad batch size": dict(batch_size=0),
    "batch size str": dict(batch_size="10"),
    "bad context turns": dict(context_turns=-1),
    "unknown template": dict(template="no-such-template"),
    "empty namespace": dict(namespace=""),
    "unknown flag": dict(turbo=True),
}


@pytest.mark.parametrize("case", list(INGEST_CASES))
def test_ingest_refuses_bad_arguments_and_writes_nothing(memory, tmp_path, case):
    from tiered_recall import ingest

    good = tmp_path / "chat.jsonl"
    good.write_text('{"role": "user", "content": "hello there"}\n')
    kwargs = dict(INGEST_CASES[case])
    paths = kwargs.pop("paths", [str(good)])
    before = memory.count()
    with pytest.raises((TieredRecallError, TypeError, ValueError)) as info:
        ingest(paths, memory=memory, progress=False, **kwargs)
    assert _clear(str(info.value)), str(info.value)
    assert memory.count() == before


def test_ingest_of_non_utf8_and_garbage_files_fails_clearly_and_writes_nothing(memory, tmp_path):
    from tiered_recall import ingest

    before = memory.count()
    for name, content in [("a.jsonl", b"\xff\xfe\x00garbage\n"), ("b.jsonl", b"{not json\n"), ("c.json", b""),
                          ("d.jsonl", b'{"role": "user", "content": "\xff\xfe"}\n')]:
        path = tmp_path / name
        path.write_bytes(content)
        try:
            ingest([str(path)], memory=memory, progress=False)
        except TieredRecallError as exc:
            assert _clear(str(exc)), (name, str(exc))
        else:  # accepted (e.g. an empty file): then it added nothing
            pass
        assert memory.count() == before, name


# ---- the command line -------------------------------------------------------------------------

@pytest.fixture
def cli(tmp_path):
    from typer.testing import CliRunner

    from tiered_recall.cli import app

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args), catch_exceptions=True)

    return invoke


CLI_CASES = [
    ("add",),  # no texts
    ("add", "x", "--metadata", "{not json"),
    ("add", "x", "--metadata", "[1, 2]"),
    ("add", "x", "--device", "tpu"),
    ("add", "x", "--embedder", "gpt-17"),
    ("add", "x", "--namespace", ""),
    ("add", "x", "--hot-capacity", "0"),
    ("add", "x", "--hot-capacity", "many"),
    ("add", "x", "--no-such-flag"),
    ("search",),
    ("search", "x", "-k", "0"),
    ("search", "x", "-k", "ten"),
    ("search", "x", "--where", "not ) sql"),
    ("search", "", ),
    ("ingest", "/nonexistent/file.jsonl"),
    ("ingest", "{good}", "--format", "yaml"),
    ("ingest", "{good}", "--batch-size", "0"),
    ("serve", "--name", "../escape", "--dim", "8", "--capacity", "4"),
    ("serve", "--name", "ok", "--dim", "0", "--capacity", "4"),
    ("serve", "--name", "ok", "--dim", "8", "--capacity", "4", "--backend", "tpu"),
    ("frobnicate",),
]


@pytest.mark.parametrize("args", CLI_CASES, ids=lambda a: " ".join(a) or "none")
def test_cli_refuses_bad_input_with_a_clear_message_and_exit_code(cli, tmp_path, args):
    store = tmp_path / "store"
    good = tmp_path / "chat.jsonl"
    good.write_text('{"role": "user", "content": "hello there"}\n')
    args = tuple(a.replace("{good}", str(good)) for a in args)
    extra = () if args[0] in ("serve", "frobnicate") or len(args) == 1 else ("--store", str(store), "--device", "none")
    if any(a in ("--device",) for a in args):
        extra = ("--store", str(store))
    result = cli(*args, *extra)
    assert result.exit_code != 0, result.output
    text = result.output + (str(result.exception) if result.exception and not isinstance(result.exception, SystemExit) else "")
    assert "Traceback" not in text, text
    assert isinstance(result.exception, SystemExit) or result.exception is None, repr(result.exception)
    assert len(text.strip()) >= 15, text
    if store.exists():  # nothing was added
        from tiered_recall import TieredMemory

        try:
            with TieredMemory(store, embedder=None, device="none") as m:
                assert m.count() == 0
        except InvalidInput:
            pass  # no config written: nothing stored


def test_an_id_past_2_63_is_refused_not_wrapped(open_memory):
    memory = open_memory()
    for call in (memory.get, memory.delete, memory.vectors):
        with pytest.raises(InvalidInput, match="at most 2\\*\\*63 - 1"):
            call([2 ** 63])
