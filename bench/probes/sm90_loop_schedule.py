#!/usr/bin/env python3
"""Did a change move ptxas's schedule of the Hopper forward's steady key-tile loop?

Compares the loop of one kernel instantiation in two builds of an sm90 forward object
(`.o` files, disassembled with cuobjdump, or `cuobjdump -sass` text): the loop is taken from the
two mbarrier waits before the first run of >= 12 HGMMAs (the S and P V issue) to the branch back
to them. Prints whether the instructions are identical, else whether the opcode sequence is
(registers renamed only), else difflib's similarity of the opcode sequences and how many moved.

Why: at the 700 W cap the loop's energy, not its cycles, sets the time, and a change anywhere
in the consumer code outside the loop can reschedule the unchanged loop (the
epilogue and lookup cuts of docs/performance.md moved 400+ of its ~1130 instructions and cost 2% at 4k). Check this
before timing a change meant to leave the loop alone.

  python3 bench/probes/sm90_loop_schedule.py old/fwd_hdim128.cu.o new/fwd_hdim128.cu.o \\
      [--kernel Li128E13__nv_bfloat16Li2ELi128ELb0E]
"""
import argparse
import difflib
import re
import subprocess
import sys


def instructions(path, kernel):
    """(address, text) of every instruction of the first function whose name contains `kernel`."""
    if path.endswith(".o") or path.endswith(".cubin"):
        text = subprocess.run(["cuobjdump", "-sass", "-arch", "sm_90a", path], check=True, capture_output=True,
                              text=True).stdout
    else:
        text = open(path).read()
    out, inside = [], False
    for line in text.splitlines():
        if "Function :" in line:
            if out:
                break
            inside = kernel in line
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;", line) if inside else None
        if m:
            out.append((int(m.group(1), 16), m.group(2)))
    if not out:
        sys.exit(f"{path}: no function matching {kernel}")
    return out


def steady_loop(ins):
    first = next((i for i in range(len(ins))
                  if "HGMMA" in ins[i][1] and sum("HGMMA" in t for _, t in ins[i:i + 150]) >= 12), None)
    if first is None:
        sys.exit("no run of 12 HGMMAs: not an sm_90a forward kernel?")
    top, waits = first, 0
    while waits < 2:  # the loop top's K and V waits
        top -= 1
        waits += "TRYWAIT" in ins[top][1]
    for j in range(first, len(ins)):
        m = re.search(r"BRA\s.*0x([0-9a-f]+)", ins[j][1])
        if m and ins[top][0] - 0x1000 < int(m.group(1), 16) <= ins[top][0]:
            return [t for _, t in ins[top:j + 1]]
    sys.exit("no back edge found")


def opcode(text):
    words = text.split()
    return words[1] if words[0].startswith("@") else words[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--kernel", default="Li128E13__nv_bfloat16Li2ELi128ELb0E",
                    help="part of the mangled name (default: d128 bf16, two consumers, 128 keys, main kernel)")
    args = ap.parse_args()
    a, b = (steady_loop(instructions(p, args.kernel)) for p in (args.old, args.new))
    print(f"loop: {len(a)} / {len(b)} instructions")
    if a == b:
        print("identical")
        return
    oa, ob = [opcode(t) for t in a], [opcode(t) for t in b]
    if oa == ob:
        print("same opcode sequence (registers differ)")
        return
    sm = difflib.SequenceMatcher(a=oa, b=ob, autojunk=False)
    moved = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != "equal")
    print(f"rescheduled: opcode similarity {sm.ratio():.3f}, {moved} opcodes moved or changed")


if __name__ == "__main__":
    main()
