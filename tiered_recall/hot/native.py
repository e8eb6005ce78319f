"""Finds the installed sidecar executable and loads the client library (libtrclient, with typed signatures) and
the search fast path (_trfast)."""
from __future__ import annotations

import ctypes as C
from functools import lru_cache
from pathlib import Path

from ..errors import SidecarUnavailable
from ..native_files import installed_extension, installed_file, load_extension
from . import layout as L

FAST_SEARCH_API = 2  # what HotTier expects of _trfast.FastClient (its API constant): search and close


def _find(filename: str) -> Path:
    path = installed_file(filename)
    if path is None:
        raise SidecarUnavailable(
            f"{filename} is not installed next to the package: reinstall with `pip install .` "
            "(it builds native/), or set TIERED_RECALL_BIN_DIR to the folder holding it"
        )
    return path


def sidecar_executable() -> Path:
    """The installed tr-sidecar; SidecarUnavailable when it cannot be found."""
    return _find("tr-sidecar")


@lru_cache(maxsize=1)
def client_library() -> C.CDLL:
    """libtrclient loaded once, with the argument and return types of its calls set."""
    lib = C.CDLL(str(_find("libtrclient.so")))
    lib.tr_client_abi_version.restype = C.c_uint32
    lib.tr_client_abi_version.argtypes = []
    lib.tr_client_register.restype = C.c_int
    lib.tr_client_register.argtypes = [C.c_void_p, C.c_int32]
    lib.tr_client_unregister.restype = None
    lib.tr_client_unregister.argtypes = [C.c_void_p, C.c_int32, C.c_int32]
    lib.tr_client_call.restype = C.c_int
    lib.tr_client_call.argtypes = [
        C.c_void_p,  # segment base
        C.c_int32,  # pid
        C.c_uint32,  # opcode
        C.c_uint32,  # flags
        C.c_uint32,  # k
        C.c_uint32,  # count
        C.c_uint64,  # ns_hash
        C.c_void_p,  # in
        C.c_uint64,  # in_bytes
        C.c_void_p,  # out
        C.c_uint64,  # out_offset
        C.c_uint64,  # out_bytes
        C.c_int64,  # timeout_ns
        C.c_int64,  # spin_ns
        C.c_int64,  # yield_ns
        C.POINTER(L.CallResult),
    ]
    lib.tr_client_expect.restype = None
    lib.tr_client_expect.argtypes = [C.c_void_p, C.c_uint64]
    lib.tr_client_search.restype = C.c_int
    lib.tr_client_search.argtypes = [C.c_void_p]  # const tr_search_call * (L.SearchCall), by address
    if lib.tr_client_abi_version() != L.LAYOUT_VERSION:
        raise SidecarUnavailable(
            f"libtrclient speaks layout {lib.tr_client_abi_version()}, the Python package "
            f"{L.LAYOUT_VERSION}: reinstall the package so both come from one build"
        )
    return lib


@lru_cache(maxsize=1)
def fast_search_module():
    """The compiled search fast path (native/src/fastsearch.c) from the folder libtrclient came from, or None where
    that build had no Python headers: HotTier then searches through libtrclient by ctypes, with the same results."""
    path = installed_extension("_trfast", [_find("libtrclient.so").parent])
    if path is None:
        return None
    module = load_extension(path, "_trfast", FAST_SEARCH_API, "searches go through ctypes, 1.5-3 us slower each")
    if module is not None and module.LAYOUT_VERSION != L.LAYOUT_VERSION:
        raise SidecarUnavailable(
            f"{path} speaks layout {module.LAYOUT_VERSION}, the Python package "
            f"{L.LAYOUT_VERSION}: reinstall the package so both come from one build"
        )
    return module
