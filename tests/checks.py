"""Counting assertions for the Python test scripts: check() records a pass or prints the failure; summary() prints
the closing 'N passed, M failed' line and returns the exit status (1 if anything failed)."""

import importlib
import os
import sys

passed = 0

# The exit status of a check that could not run (ctest reports it as "Not Run", SKIP_RETURN_CODE in CMakeLists.txt).
SKIP = 77


def require(*modules):
    """Imports the PyPI packages a check needs. Where one is missing: in CI (CI=true), where the README's setup has
    installed them, a failure naming it (exit 1); elsewhere a skip naming it and how to install it (exit SKIP)."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if not missing:
        return
    pip = " ".join(m.split(".")[0] for m in missing)
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        print(f"FAIL: {', '.join(missing)} not importable under CI, where scripts/test.sh installs it (pip install {pip})")
        sys.exit(1)
    print(f"skipped: {', '.join(missing)} not installed (pip install {pip}, or run bash scripts/test.sh, which does)")
    sys.exit(SKIP)
failed = 0

# What OpenMPI needs to run the tests' jobs: as root (CI), on 2 cores with more ranks than cores, one OpenMP
# thread per rank, and no single-copy shared memory (containers without ptrace rights refuse it mid-message). A job
# whose rank fails is ended at once (odls_base_sigkill_timeout 0: no second between SIGTERM and SIGKILL), which
# the refusal tests, a job each, paid about 1 s for; rank 0's one line is said before any rank leaves, so it is
# no less sure without that second.
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_odls_base_sigkill_timeout="0")


def mpi_script_arguments(argv):
    """(binary, mpirun) from a CLI test script's arguments: the fp8kit binary, then mpirun (empty or absent where the
    build has no MPI backend: None)."""
    return argv[1], (argv[2] if len(argv) > 2 and argv[2] else None)


class TestList(list):
    """The test functions of a script, in order: decorate each with an instance (@test), run them with
    run_test_functions(test)."""

    def __call__(self, fn):
        self.append(fn)
        return fn


def under_mpirun(mpirun, ranks, cmd):
    """cmd launched on `ranks` ranks by `mpirun` (oversubscribed, unbound); cmd itself for ranks 0."""
    if ranks == 0:
        return list(cmd)
    return [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(ranks), *cmd]


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def summary():
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def run_test_functions(tests):
    """Runs each test function (a failure raises), prints 'ok'/'FAIL' and the seconds it took per test, with the
    traceback of a failure, and the closing 'N passed, M failed' line; returns the exit status (1 if any failed)."""
    import time
    import traceback

    ok = bad = 0
    for fn in tests:
        start = time.monotonic()
        try:
            fn()
            ok += 1
            print(f"ok    {fn.__name__} ({time.monotonic() - start:.1f} s)")
        except Exception:  # noqa: BLE001 - every failure is reported and counted
            bad += 1
            print(f"FAIL  {fn.__name__} ({time.monotonic() - start:.1f} s)")
            traceback.print_exc(limit=3, file=sys.stdout)
    print(f"{ok} passed, {bad} failed")
    return 1 if bad else 0


def read_safetensors_raw(path):
    """An independent safetensors reader (not fp8kit's): ({name: (dtype, shape, raw bytes)}, __metadata__, header)."""
    import json
    import struct

    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    tensors = {k: (e["dtype"], e["shape"], b[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])
               for k, e in header.items()}
    return tensors, meta, header
