#!/usr/bin/env bash
# `make demo`: the main job. Today: a real control plane with fake H800/H20/CPU GPU pools, and a
# GPU pod placed by the real kube-scheduler on the decode-heavy (H20) pool.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${TREADLE_CACHE:-$HOME/.cache/treadle}"
TREADLE="$CACHE/venv/bin/treadle"
KUBECONFIG="$CACHE/demo.kubeconfig"
export KUBECONFIG
BIN="$(bash hack/build-k8s.sh)"
KUBECTL="$BIN/kubectl"
trap '"$TREADLE" cluster --name treadle-demo --kubeconfig "$KUBECONFIG" down' EXIT
"$TREADLE" cluster --name treadle-demo --kubeconfig "$KUBECONFIG" up
"$KUBECTL" get nodes -L treadle.dev/accelerator -L nvidia.com/gpu.product
"$KUBECTL" apply -f - <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: decode-worker}
spec:
  nodeSelector: {treadle.dev/accelerator: H20}
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  containers:
  - name: vllm
    image: vllm/vllm-openai:latest
    resources: {limits: {nvidia.com/gpu: 2}}
YAML
"$KUBECTL" wait --for=jsonpath='{.status.phase}'=Running pod/decode-worker --timeout=60s
"$KUBECTL" get pod decode-worker -o wide
