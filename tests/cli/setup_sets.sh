#!/usr/bin/env bash
# `scripts/setup.sh --audit` (what scripts/audit.sh installs) covers the build: every file the
# configure step of the build that made this gpuopt found (CMake config packages, libraries, pkg-config
# modules, Chart.js, the compiler, Ninja, CMake itself) belongs to a package of the audit set or to
# one of their dependencies; the audit set leaves out what only the tests need (browser, clang
# runtime, cross compiler, jsonschema) and is part of the full set. Skips (77) without dpkg.
# Usage: bash setup_sets.sh <gpuopt binary> <tests/data dir>
set -u
gpuopt="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
command -v dpkg-query >/dev/null || { echo "skip: no dpkg on this machine"; exit 77; }
# The build tree: the nearest CMakeCache.txt above the binary.
dir="$(cd "$(dirname "$gpuopt")" && pwd)"
while [ "$dir" != "/" ] && [ ! -f "$dir/CMakeCache.txt" ]; do dir="$(dirname "$dir")"; done
[ -f "$dir/CMakeCache.txt" ] || { echo "FAIL: no CMakeCache.txt above $gpuopt"; exit 1; }
audit=$(bash "$root/scripts/setup.sh" --audit --print) || { echo "FAIL: setup.sh --audit --print"; exit 1; }
full=$(bash "$root/scripts/setup.sh" --print) || { echo "FAIL: setup.sh --print"; exit 1; }
python3 - "$dir/CMakeCache.txt" "$audit" "$full" <<'PY'
import os, re, subprocess, sys

cache_path, audit, full = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
failures = []
for package in ("chromium", "clang", "libclang-rt-14-dev", "g++-aarch64-linux-gnu",
                "python3-jsonschema"):
    if package in audit:
        failures.append(f"the audit set installs {package}, which only the tests need")
    if package not in full:
        failures.append(f"the full set lacks {package}")
failures += [f"{p} is in the audit set but not in the full one" for p in audit if p not in full]

cache = {}
for line in open(cache_path):
    match = re.match(r"^([A-Za-z0-9_]+):[A-Z]+=(.*)$", line.rstrip("\n"))
    if match:
        cache[match.group(1)] = match.group(2)
# What configure found and needs (optional finds such as ccache and git are left out).
wanted = ["fmt_DIR", "nlohmann_json_DIR", "CLI11_DIR", "SQLite3_LIBRARY", "ZLIB_LIBRARY_RELEASE",
          "PKG_CONFIG_EXECUTABLE", "CMAKE_MAKE_PROGRAM", "CMAKE_CXX_COMPILER", "CMAKE_COMMAND"]
if cache.get("GPUOPT_BUILD_TESTS", "ON").upper() in ("ON", "1", "TRUE", "YES"):
    wanted.append("GTest_DIR")
wanted += sorted(k for k in cache if k.startswith("pkgcfg_lib_"))
paths = {k: cache[k] for k in wanted if cache.get(k, "").startswith("/")}
missing_keys = [k for k in ("fmt_DIR", "nlohmann_json_DIR", "CLI11_DIR", "CMAKE_CXX_COMPILER")
                if k not in paths]
if missing_keys:
    failures.append(f"the cache lacks {missing_keys}: has the configure step changed?")
paths["Chart.js"] = "/usr/share/javascript/chart.js/chart.min.js"

def owner(path):
    # The package that ships the path itself (a -dev package's .so link), else its target.
    for candidate in (path, os.path.realpath(path)):
        done = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout.split(":")[0].strip()
    return None

def closure(packages):
    seen, todo = set(), list(packages)
    while todo:
        package = todo.pop()
        if package in seen:
            continue
        seen.add(package)
        done = subprocess.run(["dpkg-query", "-W", "-f=${Depends}, ${Pre-Depends}, ${Provides}",
                               package], capture_output=True, text=True)
        if done.returncode != 0:
            continue
        for clause in done.stdout.split(","):
            for alternative in clause.split("|"):
                name = alternative.strip().split(" ")[0].split(":")[0]
                if name:
                    todo.append(name)
    return seen

covered = closure(audit)
for key, path in sorted(paths.items()):
    if not os.path.exists(path):
        failures.append(f"{key}: {path} does not exist")
        continue
    package = owner(path)
    if package is None:
        print(f"note: {key}: {path} belongs to no Debian package (installed by hand); not checked")
        continue
    if package not in covered:
        failures.append(f"{key}: {path} comes from {package}, which setup.sh --audit does not "
                        f"install (nor anything it depends on)")
if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"setup sets ok: {len(paths)} configure-time files covered by the {len(audit)} audit packages")
PY
