#!/usr/bin/env bash
# Installs checkov (Bridgecrew's infrastructure-as-code scanner, from PyPI) into a virtualenv of its
# own, $TREADLE_CACHE/checkov-venv: its many pinned requirements stay out of Treadle's. Called by
# hack/setup.sh; the integration test tests/integration/foundation/test_manifest_scan.py runs it
# over every rendered example and the chart. Idempotent: instant once the stamp matches.
set -euo pipefail
CACHE="${TREADLE_CACHE:-$HOME/.cache/treadle}"
VENV="$CACHE/checkov-venv"
VERSION="3.3.30"
PYTHON="${PYTHON:-python3}"
stamp="$VENV/.treadle-checkov"
fail() { echo "install-checkov: step '$1' failed: $2" >&2; exit 1; }

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$VERSION" ] && [ -x "$VENV/bin/checkov" ]; then
  exit 0
fi
echo "install-checkov: checkov==$VERSION into $VENV" >&2
mkdir -p "$CACHE"
log="$CACHE/checkov-install.log"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" || fail "python venv" "could not create $VENV"
"$VENV/bin/python" -m pip install -q "checkov==$VERSION" >"$log" 2>&1 || fail "pip install checkov==$VERSION" "$(tail -5 "$log")"
"$VENV/bin/checkov" --version >/dev/null || fail "checkov --version" "the installed checkov does not run"
echo "$VERSION" > "$stamp"
