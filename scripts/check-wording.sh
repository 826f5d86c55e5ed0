#!/usr/bin/env bash
# Fails (exit 1, listing file:line) where the docs, code comments, scripts or CMake files speak of
# how the work on gpuopt was organised (sessions, leases, numbered calls/runs/rounds, ...) instead
# of the project. A measured figure is named by its date, commit, device and command.
#
#   bash scripts/check-wording.sh [PATH ...]     (default: the whole repository)
#
# Two rule sets: prose (docs/, top-level *.md) is held to the strict one, where "session" and the
# word for an assisting person have no technical use; code, scripts and CMake files to a narrower
# one that lets Unix process sessions ("session leader", /proc/<pid>/stat's session field) and
# supporting functions or processes pass. tests/data/ (recorded machines: cgroup "session-3.scope") and the fuzz corpora
# are not read.
set -euo pipefail
cd "$(dirname "$0")/.."

self=scripts/check-wording.sh

# Rules for every file. Numbered calls/runs/rounds/iterations, unless the number is a count or a
# quantity (a count of times, a percentage, a duration).
quantity='(?!\s*(?:times|x\b|×|%|µs|us\b|ms\b|s\b|seconds|samples|warm|launches|repetitions|per\b|more|fewer|or more|\.\d|,\d))'
ordinal='(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\d+(?:st|nd|rd|th))'
common="\\b(?:call|run|round|iteration)s?\\s+\\d++${quantity}"
common+="|\\b(?:this|that|next|previous|prior|earlier|later|last|each|every|${ordinal})\\s+sessions?\\b"
common+="|\\bsessions?\\s+\\d+\\b|\\bsession's\\b"
common+="|\\b(?i:leas(?:e|es|ed|ing))\\b|\\b(?i:sprints?)\\b|\\b(?i:agents?)\\b"
common+="|\\bthis PR\\b|\\bTODO\\b.*\\breview\\b"

# Prose only: any "session" but a Unix process session, the assisting-person word unless it names a
# process, function or program, and words for the people and the tool calls behind a figure.
prose="${common}"
prose+="|(?<!process )(?<!Unix )\\b(?i:sessions?)\\b(?!\\s+leader)"
prose+="|\\b(?i:help)(?i:ers?)\\b(?!\\s+(?:process|function|program))"
prose+="|\\b(?i:the lead|lead's)\\b|\\b(?i:device calls?)\\b|\\b(?i:final review)\\b"

list_files() {
  if (($#)); then
    printf '%s\n' "$@"
  elif git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files --cached --others --exclude-standard -- \
      docs src include tools tests bench scripts cmake .ci '*.md' CMakeLists.txt CMakePresets.json
  else
    find docs src include tools tests bench scripts cmake .ci -type f; ls ./*.md CMakeLists.txt
  fi
}

status=0
while IFS= read -r file; do
  file=${file#./}
  [[ -f $file ]] || continue
  case $file in
    "$self" | tests/data/* | tests/fuzz/corpus/*) continue ;;
    docs/* | *.md) rules=$prose ;;
    *) rules=$common ;;
  esac
  if grep -InHP -- "$rules" "$file"; then status=1; fi
done < <(list_files "$@")

if ((status)); then
  echo "check-wording: the lines above speak of how the work was organised; say what the project" \
       "does, and name a figure by date, commit, device and command" >&2
fi
exit "$status"
