#!/usr/bin/env python3
"""The include graph follows DESIGN.md's layers. Two rules, for every file of src/<layer>/ and include/fp8kit/<layer>/:
1. no private header of another layer (src/<other>/...), except src/common/ (the dispatch infrastructure and the SIMD
   pieces every kernel family shares);
2. public headers only of its own layer or one above it (fp8kit/<other>/...: each layer uses only the ones above it,
   in the order of LAYERS);
3. a public header (include/fp8kit/...) includes no private header at all (src/..., common/ included): an installed
   fp8kit has none.
Fails on an include that breaks a rule and is not listed, with its reason, in layer_includes_allowed.txt, and on a
listed one that no longer exists (so the list only shrinks). Usage: check_layer_includes.py SOURCE_DIR."""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# DESIGN.md's layers, top (used by all) to bottom; common holds what every layer shares (errors, CPU features, the
# profiler, dispatch), and common/cpu the SIMD pieces the kernels of several layers share, which are built from the
# format layer's codec (so they rank below it).
LAYERS = ["common", "format", "convert", "tensor", "scaling", "ops", "nn", "io", "dist"]
RANK = ["common", "format", "common/cpu"] + LAYERS[2:]


def rank_of(layer, rel):
    """The rank of a file of `layer` at `rel` (relative to src/ or include/fp8kit/)."""
    return RANK.index("common/cpu" if rel.startswith("common/cpu/") else layer)


def main():
    root = sys.argv[1]
    src = os.path.join(root, "src")
    private_layers = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    public = os.path.join(root, "include", "fp8kit")
    assert sorted(private_layers) == sorted(LAYERS), f"src/ has {private_layers}, LAYERS lists {LAYERS}"
    found = set()
    for base, prefix in ((src, ""), (public, "include/fp8kit/")):
        for layer in LAYERS:
            for dirpath, _, files in os.walk(os.path.join(base, layer)):
                for f in files:
                    if not f.endswith((".cpp", ".hpp")):
                        continue
                    path = os.path.join(dirpath, f)
                    rel = prefix + os.path.relpath(path, base)
                    rank = rank_of(layer, os.path.relpath(path, base))
                    with open(path, encoding="utf-8") as fh:
                        for line in fh:
                            m = INCLUDE.match(line)
                            if not m:
                                continue
                            parts = m.group(1).split("/")
                            if prefix and parts[0] != "fp8kit":
                                found.add((rel, m.group(1)))  # rule 3
                            elif parts[0] in LAYERS and parts[0] not in (layer, "common"):
                                found.add((rel, m.group(1)))  # rule 1
                            elif (parts[0] == "fp8kit" and len(parts) > 2 and parts[1] in LAYERS
                                  and RANK.index(parts[1]) > rank):
                                found.add((rel, m.group(1)))  # rule 2
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
        shown = file if file.startswith("include/") else "src/" + file
        if file.startswith("include/") and not include.startswith("fp8kit/"):
            why = "a private header, from a public one: an installed fp8kit has no src/"
        elif not include.startswith("fp8kit/"):
            why = "a private header of another layer: use that layer's public header (include/fp8kit/)"
        else:
            why = ("a header of a layer below this one: move the code to the layer that may use both, or pass what "
                   "it needs in from above")
        print(f"FAIL {shown} includes \"{include}\", {why}; or list the pair with its reason in "
              f"layer_includes_allowed.txt")
    for file, include in stale:
        print(f"FAIL layer_includes_allowed.txt lists {file} -> \"{include}\", which is gone: remove the line")
    print(f"{len(found)} includes against the layers, {len(allowed)} allowed with a reason, {len(bad)} not allowed, "
          f"{len(stale)} stale")
    return 1 if bad or stale else 0


if __name__ == "__main__":
    sys.exit(main())
