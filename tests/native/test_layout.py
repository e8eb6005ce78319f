"""The Python mirror of the segment layout matches what the sidecar binary was compiled with."""
from __future__ import annotations

import ctypes
import json
import subprocess

import pytest

from tiered_recall.hot import layout as L
from tiered_recall.hot import sidecar_executable


@pytest.fixture(scope="module")
def native_layout() -> dict:
    out = subprocess.run([str(sidecar_executable()), "--print-layout"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_version_and_magic(native_layout):
    assert native_layout["layout_version"] == L.LAYOUT_VERSION
    assert native_layout["magic"] == L.MAGIC
    assert native_layout["segment_prefix"] == L.SEGMENT_PREFIX


@pytest.mark.parametrize("struct_name", sorted(L.STRUCTS))
def test_struct_sizes_and_offsets(native_layout, struct_name):
    native = native_layout[struct_name]
    mirror = L.STRUCTS[struct_name]
    assert ctypes.sizeof(mirror) == native["size"]
    for field, (offset, size) in native["fields"].items():
        descriptor = getattr(mirror, field, None)
        assert descriptor is not None, f"{struct_name}.{field} is missing from the Python mirror"
        assert (descriptor.offset, descriptor.size) == (offset, size), f"{struct_name}.{field}"
    public_fields = {name for name, _ in mirror._fields_ if not name.startswith("_")}
    assert public_fields == set(native["fields"]), "the mirror has fields the header does not"


def test_constants(native_layout):
    assert native_layout["constants"] == L.CONSTANTS


def test_payload_offsets_are_cache_aligned():
    for count in (1, 3, 17, 100):
        for dim in (1, 7, 384, 768):
            assert L.search_result_offset(count, dim) % 64 == 0
            assert L.upsert_vectors_offset(count) % 64 == 0
            assert L.upsert_reply_offset(count, dim) % 64 == 0
            assert L.upsert_vectors_offset(count) >= 24 * count
