"""Settings and storage, with no cluster running: bad settings, refused or unreachable object storage and a missing
Ray give errors that name the fix and never a credential; the manifest is a compare-and-set; LanceDB's commits on the
S3 server are conditional puts, and two commits racing keep every row."""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from tiered_recall.cli.cluster_commands import FLAGS
from tiered_recall.cluster import ClusterMemory, make_config
from tiered_recall.cluster.launch import check_storage
from tiered_recall.cluster.manifest import ManifestConflict, ManifestStore
from tiered_recall.errors import ClusterUnavailable, InvalidInput, StorageError
from tiered_recall.testing.cluster_parts import free_port


@pytest.mark.parametrize("settings, named", [
    ({"storage": "ftp://host/path", "dim": 8}, "storage"),
    ({"storage": "s3://", "dim": 8}, "storage"),
    ({"storage": "s3://bucket/p"}, "dim"),
    ({"storage": "s3://bucket/p", "dim": 8, "durability": "disk"}, "durability"),
    ({"storage": "s3://bucket/p", "dim": 8, "flush_s": 0}, "flush_s"),
    ({"storage": "s3://bucket/p", "dim": 8, "name": "two words"}, "name"),
    ({"storage": "s3://bucket/p", "dim": 8, "device": "tpu"}, "device"),
    ({"storage": "s3://bucket/p", "dim": 8, "storage_options": {"aws_region": 1}}, "storage_options"),
])
def test_bad_settings_name_the_setting_in_the_callers_spelling(settings, named):
    storage = settings.pop("storage")
    with pytest.raises(InvalidInput, match=named):
        make_config(storage, **settings)
    with pytest.raises(InvalidInput, match=FLAGS[named]):
        make_config(storage, names=FLAGS, **settings)


def _secrets(s3, *more: str) -> list[str]:
    return [s3.secret_key, s3.access_key, *more]


@pytest.mark.parametrize("port, took, status, expected", [
    (40113, "398ms", "", "cannot be reached"), (4030, "398ms", "", "cannot be reached"),
    (50883, "403.869954ms", "", "cannot be reached"), (50883, "401ms", "", "cannot be reached"),
    (9000, "398ms", "status: 403 Forbidden", "refused"), (9000, "398ms", "Client error with status 401 Unauthorized",
                                                         "refused"),
    (14010, "398ms", "status: 401", "refused"), (9000, "403.1ms", "StatusCode(403)", "refused")])
def test_a_status_code_is_read_where_it_is_named_not_from_a_port_or_a_time(port, took, status, expected) -> None:
    """An unreachable store's error names its endpoint and how long its retries took ("in 403.869954ms" made a
    fresh-clone CI run read refused credentials); a status 401 / 403 counts where the text calls it a status."""
    from tiered_recall.cluster.objectstore import storage_hint

    endpoint = f"http://127.0.0.1:{port}"
    config = make_config("s3://bucket/probe", dim=8, storage_options={"aws_endpoint": endpoint, "allow_http": "true"})
    text = (f"Generic S3 error: Error performing PUT {endpoint}/bucket/probe/x in {took}, after 3 retries, "
            f"max_retries: 3, retry_timeout: 180s - "
            f"{status or 'HTTP error: error sending request, inner: Http(HttpError { kind: Connect'}")
    assert expected in storage_hint(text, config)


@pytest.mark.parametrize("case", ["wrong secret", "unknown key", "no bucket", "unreachable"])
def test_refused_or_unreachable_storage_names_the_fix_and_never_a_credential(s3, case, caplog):
    wrong = "WRONG" + s3.secret_key[::-1]
    uri, options, expected = s3.uri("probe"), s3.options(), "refused the credentials"
    if case == "wrong secret":
        options = s3.options(aws_secret_access_key=wrong)
    elif case == "unknown key":
        options = s3.options(aws_access_key_id="AKIAUNKNOWNKEY0000")
    elif case == "no bucket":
        uri, expected = "s3://no-such-bucket/probe", "does not exist"
    else:
        options, expected = s3.options(aws_endpoint=f"http://127.0.0.1:{free_port()}"), "cannot be reached"
    config = make_config(uri, dim=8, storage_options=options)
    with pytest.raises(StorageError) as error:
        check_storage(config)
    message = str(error.value)
    assert expected in message
    assert "***" not in repr(config.storage_options) or "aws_endpoint" in repr(config.storage_options)
    for secret in _secrets(s3, wrong, "AKIAUNKNOWNKEY0000"):
        assert secret not in message and secret not in caplog.text and secret not in repr(config)


def test_a_new_cluster_storage_has_no_manifest_yet(s3):
    assert check_storage(make_config(s3.uri("fresh"), dim=8, storage_options=s3.options())) is None


def test_no_ray_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ClusterUnavailable, match=r"pip install 'tiered-recall\[cluster\]'"):
        ClusterMemory("127.0.0.1:6379")


def test_no_ray_at_the_address_says_so_at_once():
    import ray

    assert not ray.is_initialized()
    with pytest.raises(ClusterUnavailable, match="no Ray cluster answers at 127.0.0.1"):
        ClusterMemory(f"127.0.0.1:{free_port()}")


def test_two_directories_writing_one_manifest_version_one_wins(s3):
    config = make_config(s3.uri("race"), dim=8, storage_options=s3.options())
    first, second = ManifestStore(config), ManifestStore(config)
    assert first.load() is None
    assert first.write(0, {"who": "first"}) == 1
    with pytest.raises(ManifestConflict, match="two clusters use one storage prefix"):
        second.write(0, {"who": "second"})  # it had read version 0: a stale writer loses
    assert first.load()[0] == 1 and first.load()[1]["who"] == "first"
    won, lost = [], []

    def write(store, who):
        try:
            won.append((who, store.write(1, {"who": who})))
        except ManifestConflict:
            lost.append(who)

    racers = [threading.Thread(target=write, args=(store, who)) for store, who in ((first, "a"), (second, "b"))]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    assert len(won) == 1 and len(lost) == 1
    assert ManifestStore(config).load() == (2, {"who": won[0][0], "format": 1})


def test_lancedb_commits_on_the_s3_server_are_conditional_puts(s3):
    """Plant the object the next commit would write: a conditional put (If-None-Match) refuses to replace it, an
    unconditional one (the "unsafe" commit handler) would overwrite it."""
    import lancedb

    db = lancedb.connect(s3.uri("conditional"), storage_options=s3.options())
    table = db.create_table("t", data=[{"id": 0, "vector": [0.0, 1.0]}])
    version = table.version
    names = [k for k in s3.keys("conditional/t.lance/_versions/") if k.endswith(".manifest")]
    v2_naming = any(k.endswith(f"/{(1 << 64) - 1 - version:020d}.manifest") for k in names)
    assert v2_naming or any(k.endswith(f"/{version}.manifest") for k in names)  # the names are understood
    following = f"{(1 << 64) - 1 - (version + 1):020d}.manifest" if v2_naming else f"{version + 1}.manifest"
    planted = f"conditional/t.lance/_versions/{following}"
    s3.client().put_object(Bucket=s3.bucket, Key=planted, Body=b"planted by the test")
    try:
        table.add([{"id": 1, "vector": [1.0, 0.0]}])
    except Exception:
        pass  # the commit may fail on the planted object: it must not replace it
    body = s3.client().get_object(Bucket=s3.bucket, Key=planted)["Body"].read()
    assert body == b"planted by the test"


def test_two_commits_racing_on_one_table_keep_every_row(s3):
    import lancedb

    db = lancedb.connect(s3.uri("racing"), storage_options=s3.options())
    db.create_table("t", data=[{"id": 0, "vector": [0.0, 1.0]}])
    errors = []

    def append(base: int) -> None:
        table = lancedb.connect(s3.uri("racing"), storage_options=s3.options()).open_table("t")
        for i in range(8):
            try:
                table.add([{"id": base + i, "vector": np.random.rand(2).astype(np.float32).tolist()}])
            except Exception as exc:  # noqa: PERF203
                errors.append(exc)

    writers = [threading.Thread(target=append, args=(base,)) for base in (100, 200)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert errors == []
    ids = sorted(db.open_table("t").to_arrow().column("id").to_pylist())
    assert ids == [0, *range(100, 108), *range(200, 208)]
