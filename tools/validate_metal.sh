#!/usr/bin/env bash
# validate_metal.sh -- the one command a Mac user runs to check lockstep's Metal backend on their GPU.
#
#     tools/validate_metal.sh [REPORT.md]          (default: runs/metal-report-<date>.md in this checkout)
#
# It installs nothing. It checks that this is macOS with Python >= 3.11, NumPy and PyObjC's
# Metal bindings, and says what to install if something is missing. Then, from this checkout, it
# runs `lockstep conformance --backend metal --level 2 --report REPORT.md`:
#   1. conformance level 2: every op on the GPU against the spec, byte for byte;
#   2. `lockstep train --preset tiny --steps 2` (int8 on and off) on metal and on the spec:
#      every step's state root, loss, gradient norm and chain hash must be equal;
#   3. the flush probe: V1-V4 of docs/numerical-contract.md and 10**6 random products and quotients near
#      2**-126, through the GPU's bare * and / (which tininess rule Apple's hardware follows)
#      and through lockstep's ops (which must equal the spec).
# It takes a few minutes. Attach REPORT.md to an issue whatever it says: a report that
# differs, or a compiler error in it, is exactly what the project needs from a Mac.
# Exit status: 0 all equal, 2 something differs, 1 the backend could not run or a check failed to start.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
report="${1:-}"
python="${PYTHON:-python3}"

fail() { echo "validate_metal.sh: $*" >&2; exit 1; }

[ "$(uname -s)" = "Darwin" ] || fail "this is $(uname -s): the Metal backend needs macOS on a Mac with a Metal GPU (Apple silicon)"
command -v "$python" >/dev/null 2>&1 || fail "no $python found: install Python 3.11 or later (python.org or Homebrew), or set PYTHON=/path/to/python3"
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || fail "$("$python" -V 2>&1) is too old: lockstep needs Python 3.11 or later (set PYTHON=/path/to/python3.11)"
"$python" -c 'import numpy' 2>/dev/null \
  || fail "NumPy is missing: run   $python -m pip install -e '$here[metal]'   (in a virtual environment if you prefer), then run this again"
"$python" -c 'import Metal' 2>/dev/null \
  || fail "PyObjC's Metal bindings are missing: run   $python -m pip install -e '$here[metal]'   then run this again"

if [ -z "$report" ]; then
  mkdir -p "$here/runs"  # runs/ is git-ignored
  report="$here/runs/metal-report-$(date +%Y%m%d-%H%M%S).md"
fi
case "$report" in /*) ;; *) report="$(pwd)/$report" ;; esac
echo "validate_metal.sh: lockstep from $here, $("$python" -V 2>&1), macOS $(sw_vers -productVersion 2>/dev/null || echo '?') on $(uname -m)"
echo "validate_metal.sh: writing $report (this takes a few minutes)"
cd "$here"  # python -m runs this checkout's lockstep, not an installed one
set +e
"$python" -m lockstep.cli conformance --backend metal --level 2 --report "$report"
status=$?
set -e
[ -f "$report" ] && echo "validate_metal.sh: done (exit status $status); please attach $report to an issue"
exit "$status"
