"""Counting assertions for the Python test scripts: check() records a pass or prints the failure; summary() prints
the closing 'N passed, M failed' line and returns the exit status (1 if anything failed)."""

passed = 0
failed = 0


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
