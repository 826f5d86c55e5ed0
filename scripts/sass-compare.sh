#!/usr/bin/env bash
# Compares the device code of two builds kernel by kernel, to show that a source change left the
# generated SASS as it was (runs anywhere: no GPU needed).
#   bash scripts/sass-compare.sh OLD NEW [KERNEL_REGEX]
# OLD and NEW are objects, libraries or executables with device code (anything cuobjdump reads).
# One line per (architecture, kernel) found in either: registers, stack and local bytes, static
# shared bytes (from `cuobjdump -res-usage`); local-memory instructions (STL/LDL: spills or local
# arrays), SASS instructions (NOPs left out), and the instructions of the main loop: the
# backward-branch loop holding the most mma instructions (HMMA/HGMMA), the innermost on a tie.
# "same" says whether the two instruction streams match exactly (opcodes, operands, branch
# targets). A kernel in one build only is listed with "-" on the other side.
# cuobjdump: $CUOBJDUMP, else on PATH, else /usr/local/cuda/bin (the CUDA toolkit, or the PyPI
# package nvidia-cuda-cuobjdump, whose bin/ must then be on PATH).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OLD NEW [KERNEL_REGEX]" >&2
  exit 2
fi
cuobjdump="${CUOBJDUMP:-$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)}"
if [ ! -x "$cuobjdump" ]; then
  echo "$0: cuobjdump not found (set CUOBJDUMP, or pip install nvidia-cuda-cuobjdump)" >&2
  exit 2
fi
for file in "$1" "$2"; do
  if [ ! -r "$file" ]; then
    echo "$0: cannot read $file" >&2
    exit 2
  fi
done
python3 - "$cuobjdump" "$1" "$2" "${3:-.}" <<'PY'
import re, subprocess, sys

cuobjdump, old_path, new_path, pattern = sys.argv[1:5]
kernel_filter = re.compile(pattern)


def run(*args):
    result = subprocess.run([cuobjdump, *args], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"sass-compare.sh: cuobjdump {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def demangle(names):
    result = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    lines = result.stdout.splitlines() if result.returncode == 0 else names
    return dict(zip(names, lines))


def short_name(demangled):
    # "void ns::(anonymous namespace)::k_x<A, B>(Params)" -> "k_x<A, B>"
    name = re.sub(r"^void ", "", demangled)
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list starts at the first '(' outside <>
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and not name.startswith("(anonymous", i):
            cut = i
            break
    name = name[:cut]
    head, sep, tail = name.partition("<")
    return head.split("::")[-1] + sep + tail


instruction_line = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
branch_target = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def load(path):
    """{(arch, mangled): record} of one build."""
    kernels = {}
    arch, name = None, None
    for line in run("-res-usage", path).splitlines():
        if m := re.match(r"\s*arch = (sm_\w+)", line):
            arch = m.group(1)
        elif m := re.match(r"\s*Function (\S+):", line):
            name = m.group(1)
        elif name and (m := re.match(r"\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)):
            kernels[(arch, name)] = dict(zip(("regs", "stack", "shared", "local"),
                                             map(int, m.groups())))
            name = None
    arch, name, code = None, None, []

    def finish():
        if name is not None:
            kernels.setdefault((arch, name), {}).update(analyse(code))

    for line in run("-sass", path).splitlines():
        if m := re.match(r"\s*code for (sm_\w+)", line):
            finish()
            arch, name, code = m.group(1), None, []
        elif m := re.match(r"\s*Function : (\S+)", line):
            finish()
            name, code = m.group(1), []
        elif m := instruction_line.match(line):
            code.append((int(m.group(1), 16), m.group(2)))
    finish()
    # A cubin's resource listing names no architecture: take the one its SASS names.
    for arch, name in [key for key in kernels if key[0] is None]:
        record = kernels.pop((arch, name))
        for other in [key for key in kernels if key[1] == name]:
            kernels[other] = {**record, **kernels[other]}
    return kernels


def opcode(text):
    parts = text.split()
    if parts and parts[0].startswith("@"):
        parts = parts[1:]
    return parts[0] if parts else ""


def analyse(code):
    body = [(address, text) for address, text in code if opcode(text) != "NOP"]
    local = sum(1 for _, text in body if opcode(text).split(".")[0] in ("STL", "LDL"))
    loop, best = None, None
    for address, text in body:
        m = branch_target.search(text)
        if not m or int(m.group(1), 16) > address:
            continue
        start = int(m.group(1), 16)
        inside = [t for a, t in body if start <= a <= address]
        mma = sum(1 for t in inside if opcode(t).split(".")[0] in ("HMMA", "HGMMA"))
        key = (mma, -len(inside))
        if mma > 0 and (best is None or key > best):
            best, loop = key, len(inside)
    return {"instructions": len(body), "ldl_stl": local, "loop": loop,
            "text": [text for _, text in body]}


def by_name(kernels):
    # Keyed by the demangled name without namespaces: an anonymous namespace's mangled tag may
    # differ between the two builds.
    names = demangle(sorted({mangled for _, mangled in kernels}))
    return {(arch, short_name(names.get(mangled, mangled))): record
            for (arch, mangled), record in kernels.items()}


old, new = by_name(load(old_path)), by_name(load(new_path))
rows = []
for arch, name in sorted(set(old) | set(new)):
    if not kernel_filter.search(name):
        continue
    a, b = old.get((arch, name), {}), new.get((arch, name), {})

    def pair(field):
        x, y = a.get(field), b.get(field)
        x = "-" if x is None else str(x)
        y = "-" if y is None else str(y)
        return x if x == y else f"{x}->{y}"

    count = pair("instructions")
    if a.get("instructions") is not None and b.get("instructions") is not None:
        delta = b["instructions"] - a["instructions"]
        if delta:
            count += f" ({delta:+d})"
    same = "yes" if a.get("text") is not None and a.get("text") == b.get("text") else "no"
    rows.append((arch, name, pair("regs"), pair("ldl_stl"), pair("stack"), pair("local"),
                 pair("shared"), count, pair("loop"), same))
header = ("arch", "kernel", "regs", "ldl/stl", "stack", "local", "shared", "instructions",
          "main loop", "same")
widths = [max(len(str(row[i])) for row in rows + [header]) for i in range(len(header))]
for row in [header] + rows:
    print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
changed = sum(1 for row in rows if row[-1] != "yes")
print(f"{len(rows)} kernels, {len(rows) - changed} with identical SASS, {changed} different")
PY
