"""tr-sidecar's options: --print-config prints them as JSON (defaults, and what each flag sets), --help lists every
flag with its default, bad flags and values are refused with a message that names the flag, and the Python
keywords of sidecar_args / start_sidecar map onto the flags. CPU only: nothing here starts a server."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from tiered_recall.errors import InvalidInput
from tiered_recall.hot import sidecar_args, sidecar_executable, start_sidecar

DEFAULTS = {
    "name": None, "dim": None, "capacity": None, "dtype": "f32", "backend": "cpu", "slots": 32, "slot_bytes": None,
    "namespaces": None, "threads": None, "device": 0, "codes": "int8", "codes_min_rows": None, "idle_spin_us": 2000,
    "gather_us": 25,
    "exit_when_orphaned": 0, "verbose": False, "daemon": False, "ready_fd": None, "cuda_persist": True,
    "cuda_one_trip_max_rows": 131072, "cuda_split_max_rows": None, "cuda_verbose": False, "cuda_profile": False,
    "test_poison_results": False, "test_no_zero_copy": False, "test_cpu_isa": "auto", "test_batched_server": False,
}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(sidecar_executable()), *args], capture_output=True, text=True, timeout=30)


def config(*args: str) -> dict:
    out = run(*args, "--print-config")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    return json.loads(out.stdout)


def test_print_config_prints_the_defaults_as_json():
    assert config() == DEFAULTS


@pytest.mark.parametrize("args,key,value", [
    (["--gather-us", "0"], "gather_us", 0),
    (["--gather-us=40"], "gather_us", 40),
    (["--idle-spin-us", "5"], "idle_spin_us", 5),
    (["--cuda-persist", "off"], "cuda_persist", False),
    (["--cuda-one-trip-max-rows", "0"], "cuda_one_trip_max_rows", 0),
    (["--cuda-split-max-rows", "4096"], "cuda_split_max_rows", 4096),
    (["--cuda-verbose"], "cuda_verbose", True),
    (["--cuda-profile"], "cuda_profile", True),
    (["--test-poison-results"], "test_poison_results", True),
    (["--test-no-zero-copy"], "test_no_zero_copy", True),
    (["--test-batched-server"], "test_batched_server", True),
    (["--dtype", "float16"], "dtype", "f16"),
    (["--codes", "off"], "codes", "off"),
    (["--codes", "int8"], "codes", "int8"),
    (["--codes-min-rows", "0"], "codes_min_rows", 0),
    (["--test-cpu-isa", "scalar"], "test_cpu_isa", "scalar"),
    (["--slots", "7"], "slots", 7),
    (["--ready-fd", "3"], "ready_fd", 3),
    (["--name", 'odd "name" \\'], "name", 'odd "name" \\'),  # JSON escaping
])
def test_a_flag_changes_the_printed_value(args, key, value):
    got = config(*args)
    assert got[key] == value
    assert {k: v for k, v in got.items() if k != key} == {k: v for k, v in DEFAULTS.items() if k != key}


def test_print_config_comes_after_the_other_flags():
    """Flags after --print-config count too."""
    out = run("--print-config", "--gather-us", "9", "--dim", "8")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["gather_us"] == 9 and got["dim"] == 8


@pytest.mark.parametrize("args,flag", [
    (["--gather-us", "-1"], "--gather-us"),
    (["--gather-us", "ten"], "--gather-us"),
    (["--gather-us", "99999999"], "--gather-us"),
    (["--cuda-persist", "maybe"], "--cuda-persist"),
    (["--cuda-split-max-rows", ""], "--cuda-split-max-rows"),
    (["--slots", "0"], "--slots"),
    (["--dim", "x"], "--dim"),
    (["--dtype", "f64"], "--dtype"),
    (["--backend", "tpu"], "--backend"),
    (["--codes", "int4"], "--codes"),
    (["--codes", ""], "--codes"),
    (["--codes-min-rows", "-5"], "--codes-min-rows"),
    (["--test-cpu-isa", "sse2"], "--test-cpu-isa"),
    (["--no-such-flag"], "--no-such-flag"),
    (["--cuda-fuse-max", "2"], "--cuda-fuse-max"),  # a switch that was deleted is refused like any unknown flag
    (["--gather-us"], "--gather-us"),              # no value
])
def test_a_bad_flag_or_value_is_refused_with_a_message_naming_the_flag(args, flag):
    out = run(*args, "--print-config")
    assert out.returncode == 2
    assert out.stdout == ""
    assert flag in out.stderr, out.stderr
    assert out.stderr.startswith("tr-sidecar: ")


def test_help_lists_every_flag_with_its_default():
    out = run("--help")
    assert out.returncode == 0
    lines = re.split(r"\n(?=  --)", out.stdout)
    for key in DEFAULTS:
        flag = "--" + key.replace("_", "-")
        entry = next((line for line in lines if line.startswith(f"  {flag} ") or line.startswith(f"  {flag}\n")), None)
        assert entry is not None, f"{flag} is not in --help"
        assert "(default: " in entry or "(required)" in entry, entry
    for action in ("--print-config", "--print-layout", "--backends", "--version", "--help"):
        assert f"  {action} " in out.stdout
    assert "tests only" in out.stdout  # the test flags say what they are


def test_sidecar_args_keywords_reach_the_flags():
    args = sidecar_args("opts", dim=8, capacity=10, gather_us=7, idle_spin_us=300, cuda_persist=False,
                        cuda_one_trip_max_rows=1000, cuda_split_max_rows=0, cuda_verbose=True, cuda_profile=True,
                        codes="off", codes_min_rows=64, test_cpu_isa="avx2",
                        test_poison_results=True, test_no_zero_copy=True, test_batched_server=True)
    out = subprocess.run(args + ["--print-config"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    want = {**DEFAULTS, "name": "opts", "dim": 8, "capacity": 10, "gather_us": 7, "idle_spin_us": 300,
            "cuda_persist": False, "cuda_one_trip_max_rows": 1000, "cuda_split_max_rows": 0, "cuda_verbose": True,
            "cuda_profile": True, "codes": "off", "codes_min_rows": 64, "test_cpu_isa": "avx2",
            "test_poison_results": True, "test_no_zero_copy": True, "test_batched_server": True}
    assert got == want
    plain = json.loads(subprocess.run(sidecar_args("opts", dim=8, capacity=10) + ["--print-config"],
                                      capture_output=True, text=True, timeout=30, check=True).stdout)
    assert plain == {**DEFAULTS, "name": "opts", "dim": 8, "capacity": 10}


@pytest.mark.parametrize("kwargs", [
    dict(gather_us=-1), dict(gather_us=2.5), dict(gather_us=True), dict(cuda_persist="off"),
    dict(cuda_split_max_rows=-5), dict(idle_spin_us="5"), dict(codes="int4"), dict(codes=True),
    dict(codes_min_rows=-1), dict(test_cpu_isa="sse2"),
])
def test_sidecar_args_refuses_bad_keywords(kwargs):
    with pytest.raises(InvalidInput):
        sidecar_args("opts", dim=8, capacity=10, **kwargs)


def test_start_sidecar_takes_a_wrapper_as_a_list(segment_name):
    with pytest.raises(InvalidInput, match="list of words"):
        start_sidecar(segment_name, dim=8, capacity=10, wrapper="env")
    with pytest.raises(InvalidInput, match="detach"):
        start_sidecar(segment_name, dim=8, capacity=10, wrapper=["env"], detach=True)


def test_a_wrapper_runs_the_sidecar(start):
    """wrapper=[...] puts a command in front of tr-sidecar (benchmarks/gpu_sanitize.sh: compute-sanitizer); the
    sidecar is the wrapper's child, found by its segment, and stop() stops it and so the wrapper."""
    proc, hot = start(dim=8, capacity=10, wrapper=["sh", "-c", '"$@"; exit $?', "wrapper"])
    assert proc.server_pid != proc.pid and proc.server_pid == hot.owner_pid
    hot.ping()
    hot.close()
    assert proc.stop() == 0


def test_codes_int8_with_f32_rows_on_cuda_is_refused_with_the_fix():
    """The CUDA backend re-scores its candidates with the f16 scan's tensor-core arithmetic: codes need f16 rows
    there, and its f32 rows default to codes off."""
    if "cuda" not in run("--backends").stdout.split():
        pytest.skip("this build has no CUDA backend")
    assert config("--backend", "cuda", "--dtype", "f32")["codes"] == "off"
    assert config("--backend", "cuda")["codes"] == "int8"
    out = run("--backend", "cuda", "--dtype", "f32", "--codes", "int8", "--print-config")
    assert out.returncode == 2 and "--codes int8 needs --dtype f16" in out.stderr and "--codes off" in out.stderr


def test_an_instruction_set_the_cpu_lacks_is_refused_at_start(segment_name):
    """--test-cpu-isa names the scan's kernel; asking for one this CPU does not have fails the start, saying so."""
    from pathlib import Path

    from tiered_recall.errors import SidecarUnavailable

    flags = Path("/proc/cpuinfo").read_text().split()
    missing = next((isa for isa, flag in (("avx512-vnni", "avx512_vnni"), ("avx-vnni", "avx_vnni"), ("avx2", "avx2"))
                    if flag not in flags), None)
    if missing is None:
        pytest.skip("this CPU has every instruction set the scan can use")
    with pytest.raises(SidecarUnavailable, match=f"--test-cpu-isa {missing}"):
        start_sidecar(segment_name, dim=8, capacity=10, test_cpu_isa=missing)
