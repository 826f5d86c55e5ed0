# Sourced by GPU-machine scripts: makes Python packages importable from wheels carried in
# .anchors/wheels (the GPU machine has no package registry). Installs them into a private target
# directory, never into the machine's venv, and puts it on PYTHONPATH.
#   carried_wheels TARGET_DIR PACKAGE...   returns 1 when a package cannot be installed
carried_wheels() {
  local target="$1"
  shift
  local root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  local wheels="$root/.anchors/wheels"
  [ -d "$wheels" ] || return 1
  mkdir -p "$target"
  python3 -m pip install -q --no-index --find-links "$wheels" --target "$target" "$@" \
    >"$target.log" 2>&1 || return 1
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
}
