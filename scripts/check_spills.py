#!/usr/bin/env python3
"""Fails when a build log shows a register spill that scripts/spill_allowlist.txt does not allow.

    python3 scripts/check_spills.py BUILD_LOG

ptxas prints one warning per spilling function and architecture (-Xptxas=-warn-spills,
CMakeLists.txt). Each is demangled (c++filt) and matched against the allowlist's patterns;
a spill no pattern allows, or larger than its pattern allows, is an error. Only what the
build compiled is in its log: a clean build (CI) sees every kernel.
"""
import re
import subprocess
import sys
from pathlib import Path

WARNING = re.compile(r"Registers are spilled to local memory in function '([^']+)', (\d+) bytes spill stores")


def allowlist(path):
    """(compiled regex, max spill-store bytes, reason) per non-comment line: PATTERN | BYTES | REASON."""
    entries = []
    for line in Path(path).read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pattern, limit, reason = (part.strip() for part in line.split("|", 2))
        entries.append((re.compile(pattern), int(limit), reason))
    return entries


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    spills = {}  # mangled name -> largest spill-store bytes over the architectures
    for m in WARNING.finditer(Path(sys.argv[1]).read_text(errors="replace")):
        spills[m.group(1)] = max(spills.get(m.group(1), 0), int(m.group(2)))
    entries = allowlist(Path(__file__).with_name("spill_allowlist.txt"))
    errors = []
    for (mangled, stores), name in zip(spills.items(), demangle(list(spills))):
        match = next((e for e in entries if e[0].search(name)), None)
        if match is None:
            errors.append(f"{stores} bytes spilled in {name}: not in scripts/spill_allowlist.txt")
        elif stores > match[1]:
            errors.append(f"{stores} bytes spilled in {name}: the allowlist allows {match[1]} ({match[2]})")
    print(f"check_spills: {len(spills)} spilling functions in the log, {len(errors)} not allowed")
    for e in errors:
        print("  " + e)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
