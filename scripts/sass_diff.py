#!/usr/bin/env python3
"""Compares the machine code (SASS) of two CUDA builds of flashattn, kernel by kernel.

A refactor of a kernel that must not move its speed is checked here first: when every
instantiation's SASS is the same (addresses and line info aside), the speed cannot have
changed and no benchmark is needed (docs/architecture.md, "Changing a kernel").

    python3 scripts/sass_diff.py OLD_BUILD NEW_BUILD [--only sm80/fwd] [--verbose]
        [--ignore-arg 'flashattn::cuda::sm80::DenseKeys(::Tiles)?']

Both directories are CMake build trees of the library (the objects under
CMakeFiles/flashattn_objects.dir/src/cuda); every object present in both is compared for each
architecture it holds (sm_80, sm_90a, ...). Exit status 0 when all compared kernels are
identical, 1 otherwise. Needs `cuobjdump` (the CUDA toolkit's, or PyPI's nvidia-cuda-cuobjdump).

--ignore-arg pairs a kernel that gained a policy argument with its old self: names are
demangled (`c++filt`) and every template argument or parameter ", X" whose X matches the
regular expression is dropped from them (a new policy type with a default, and the empty
parameter it brings, e.g. the sm80 forward's DenseKeys and DenseKeys::Tiles).
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
        # A fatbin entry's header ends the function before it: read into it, the last kernel
        # of one architecture differed between an object built for one architecture and one
        # built for two.
        if line.startswith("Fatbin") or re.match(r"\s*(=+|code version = .*|host = .*)$", line):
            cur = None
            continue
        m = re.match(r"\s*arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
            cur = None
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


def rename(table, ignored):
    """table with its function names demangled and the ignored arguments dropped."""
    if not ignored:
        return table
    names = [name for _, name in table]
    text = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    pattern = re.compile(", (?:" + "|".join(ignored) + r")(?=[,>)])")
    out = collections.OrderedDict()
    for (key, lines), plain in zip(table.items(), text.splitlines()):
        out[key[0], pattern.sub("", plain)] = lines
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--only", default="", help="compare objects whose path contains this (e.g. sm90/bwd)")
    ap.add_argument("--verbose", action="store_true", help="name every kernel, not only the different ones")
    ap.add_argument("--ignore-arg", action="append", default=[],
                    help="regex of a template argument / parameter type to drop from demangled names (repeatable)")
    args = ap.parse_args()
    old_root, new_root = pathlib.Path(args.old) / OBJECTS, pathlib.Path(args.new) / OBJECTS
    totals = collections.Counter()
    for new_obj in sorted(new_root.rglob("*.o")):
        rel = new_obj.relative_to(new_root)
        old_obj = old_root / rel
        if args.only not in str(rel) or not old_obj.exists():
            continue
        a, b = rename(kernels(old_obj), args.ignore_arg), rename(kernels(new_obj), args.ignore_arg)
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
