#!/usr/bin/env python3
"""Compares the machine code (SASS) of two CUDA builds of flashattn, kernel by kernel.

A refactor of a kernel that must not move its speed is checked here first: when every
instantiation's SASS is the same (addresses and line info aside), the speed cannot have
changed and no benchmark is needed (docs/architecture.md, "Changing a kernel").

    python3 scripts/sass_diff.py OLD_BUILD NEW_BUILD [--only sm80/fwd] [--verbose]

Both directories are CMake build trees of the library (the objects under
CMakeFiles/flashattn_objects.dir/src/cuda); every object present in both is compared for each
architecture it holds (sm_80, sm_90a, ...). Exit status 0 when all compared kernels are
identical, 1 otherwise. Needs `cuobjdump` (the CUDA toolkit's, or PyPI's nvidia-cuda-cuobjdump).
"""
import argparse
import collections
import pathlib
import re
import subprocess
import sys

OBJECTS = pathlib.Path("CMakeFiles/flashattn_objects.dir/src/cuda")


def kernels(obj: pathlib.Path):
    """{(arch, function): [normalized SASS lines]} of one object file."""
    text = subprocess.run(["cuobjdump", "-sass", str(obj)], capture_output=True, text=True, check=True).stdout
    out = collections.OrderedDict()
    arch = cur = None
    for line in text.splitlines():
        m = re.match(r"\s*arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
            continue
        if line.strip().startswith("Function :"):
            cur = (arch, line.split(":", 1)[1].strip())
            out[cur] = []
            continue
        # Drop addresses (/*0a30*/), encodings after ';', and lines that only carry
        # file names or fatbin headers.
        body = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).split(";")[0].strip()
        if cur and body and not body.startswith(("/*", ".", "code for")) and "Fatbin" not in body:
            out[cur].append(body)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--only", default="", help="compare objects whose path contains this (e.g. sm90/bwd)")
    ap.add_argument("--verbose", action="store_true", help="name every kernel, not only the different ones")
    args = ap.parse_args()
    old_root, new_root = pathlib.Path(args.old) / OBJECTS, pathlib.Path(args.new) / OBJECTS
    totals = collections.Counter()
    for new_obj in sorted(new_root.rglob("*.o")):
        rel = new_obj.relative_to(new_root)
        old_obj = old_root / rel
        if args.only not in str(rel) or not old_obj.exists():
            continue
        a, b = kernels(old_obj), kernels(new_obj)
        for key in sorted(set(a) | set(b), key=str):
            arch, name = key
            if key not in a or key not in b:
                state = "only in new" if key not in a else "only in old"
            else:
                state = "identical" if a[key] == b[key] else f"DIFFERENT ({len(a[key])} -> {len(b[key])} lines)"
            totals[arch, state.split(" ")[0]] += 1
            if args.verbose or state != "identical":
                print(f"{rel} {arch} {state}: {name[:110]}")
    for (arch, state), n in sorted(totals.items()):
        print(f"{arch}: {n} {state}")
    if not totals:
        print("no objects compared")
        return 1
    return 0 if all(state == "identical" for (_, state) in totals) else 1


if __name__ == "__main__":
    sys.exit(main())
