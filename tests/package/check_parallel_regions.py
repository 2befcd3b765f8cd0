"""Every OpenMP parallel region in src/ names its team size (`num_threads(...)`, from fp8kit::num_threads()): the
thread count is the process's (set_num_threads), where OpenMP's own default is the calling thread's, so a region
without the clause would run a server's worker threads at the wrong count (docs/conversions.md, Threads).
Usage: check_parallel_regions.py SOURCE_DIR"""

import pathlib
import re
import sys


def regions(text):
    """(line number, directive) of each `#pragma omp parallel`, its continuation lines joined."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if re.match(r"\s*#\s*pragma\s+omp\s+parallel\b", lines[i]):
            start, directive = i + 1, lines[i]
            while directive.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                directive = directive.rstrip()[:-1] + " " + lines[i].strip()
            yield start, directive
        i += 1


def main():
    root = pathlib.Path(sys.argv[1]) / "src"
    checked, missing = 0, []
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".cpp", ".hpp", ".cu", ".cuh"):
            continue
        for line, directive in regions(path.read_text()):
            checked += 1
            if "num_threads(" not in directive:
                missing.append(f"{path.relative_to(root.parent)}:{line}: {directive.strip()}")
    for m in missing:
        print(f"FAIL: a parallel region without num_threads(::fp8kit::num_threads()): {m}")
    print(f"{checked} parallel regions checked, {len(missing)} without a thread count")
    return 1 if missing or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
