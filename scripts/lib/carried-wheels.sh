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

# The carried gpuopt wheel (.whl/gpuopt-*.whl, built here by the README's `pip wheel` command)
# installed for the machine's own python3 (PyTorch's venv: torch, numpy and pytest come from there;
# a venv made inside it would not see them) into a scratch folder put on PYTHONPATH. Sets `site`
# to that folder (the caller removes it). Returns 2 when no wheel was carried, 1 when pip fails
# (its log in LOG).
#   install_gpuopt_wheel LOG
install_gpuopt_wheel() {
  local log="$1" root wheel
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  wheel=$(ls -t "$root"/.whl/gpuopt-*.whl 2>/dev/null | head -1)
  [ -n "$wheel" ] || return 2
  site=$(mktemp -d /tmp/gpuopt-wheel-XXXXXX)
  python3 -m pip install --no-deps --no-index --no-compile -q --target "$site" "$wheel" \
    >"$log" 2>&1 || return 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$site/bin:$PATH"
}
