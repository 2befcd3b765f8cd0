#!/usr/bin/env python3
"""No file of a layer includes another layer's private headers (src/<layer>/...), except src/common/ (the dispatch
infrastructure every kernel family shares) and the pairs listed, each with its reason, in layer_includes_allowed.txt.
Fails on a private include that is not listed, and on a listed one that no longer exists (so the list only
shrinks). Usage: check_layer_includes.py SOURCE_DIR."""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def main():
    root = sys.argv[1]
    src = os.path.join(root, "src")
    layers = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    found = set()
    for layer in layers:
        for dirpath, _, files in os.walk(os.path.join(src, layer)):
            for f in files:
                if not f.endswith((".cpp", ".hpp")):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, src)
                with open(path, encoding="utf-8") as fh:
                    for line in fh:
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1).split("/")[0]
                        if target in layers and target not in (layer, "common"):
                            found.add((rel, m.group(1)))
    allowed = {}
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "layer_includes_allowed.txt"),
              encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            pair, _, reason = line.partition("  # ")
            file, include = pair.split()
            assert reason, f"layer_includes_allowed.txt: '{line}' gives no reason"
            allowed[(file, include)] = reason
    bad = sorted(found - allowed.keys())
    stale = sorted(allowed.keys() - found)
    for file, include in bad:
        print(f"FAIL src/{file} includes \"{include}\", a private header of another layer: use that layer's public "
              f"header (include/fp8kit/), or list the pair with its reason in layer_includes_allowed.txt")
    for file, include in stale:
        print(f"FAIL layer_includes_allowed.txt lists src/{file} -> \"{include}\", which is gone: remove the line")
    print(f"{len(found)} cross-layer private includes, {len(allowed)} allowed with a reason, {len(bad)} not allowed, "
          f"{len(stale)} stale")
    return 1 if bad or stale else 0


if __name__ == "__main__":
    sys.exit(main())
