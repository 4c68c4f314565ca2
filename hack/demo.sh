#!/usr/bin/env bash
# `make demo`: Treadle's vertical slice, in three parts.
#   1. Kubernetes: the operator reconciles RolloutJobs onto fake H800/H20 GPU pools of a real control
#      plane (etcd, kube-apiserver, controller-manager, scheduler; KWOK plays the kubelets).
#   2. Local rollout: a RolloutJob run end to end with every service a process on 127.0.0.1
#      (simulated engine, labelled so).
#   3. The learning loop: GRPO on a tiny model with real vLLM on CPU; rollout, reward, buffer,
#      training, weight publication and hot swap, mean reward per step.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${TREADLE_CACHE:-$HOME/.cache/treadle}"
VENV="$CACHE/venv"
TREADLE="$VENV/bin/treadle"
BIN="$(bash hack/build-k8s.sh)"
KUBECONFIG="$CACHE/demo.kubeconfig"
export KUBECONFIG
kubectl() { "$BIN/kubectl" "$@"; }
section() { printf '\n\033[1m== %s ==\033[0m\n' "$*"; }
OPERATOR_PID=""
cleanup() {
  [ -n "$OPERATOR_PID" ] && kill "$OPERATOR_PID" 2>/dev/null && wait "$OPERATOR_PID" 2>/dev/null
  "$TREADLE" cluster --name treadle-demo --kubeconfig "$KUBECONFIG" down
}
trap cleanup EXIT

section "1/3 Kubernetes: RolloutJobs reconciled onto H800 (prefill-heavy) and H20 (decode-heavy) pools"
"$TREADLE" cluster --name treadle-demo --kubeconfig "$KUBECONFIG" up
kubectl get nodes -L treadle.dev/accelerator -L nvidia.com/gpu.product
"$BIN/helm" upgrade --install treadle charts/treadle --namespace treadle-system --create-namespace --wait=false
until [ "$(kubectl get crd rolloutjobs.treadle.dev -o 'jsonpath={.status.conditions[?(@.type=="Established")].status}')" = True ]; do sleep 0.5; done
echo "KWOK nodes run no containers, so the operator runs here as a process against the real API server."
"$TREADLE" operator run --kubeconfig "$KUBECONFIG" --metrics-port 0 --liveness-port 0 >"$CACHE/demo-operator.log" 2>&1 &
OPERATOR_PID=$!
kubectl apply -f manifests/examples/math-tool-h20.yaml -f manifests/examples/swe-h800.yaml
kubectl wait rolloutjob --all --for=condition=Ready --timeout=180s
kubectl get rolloutjobs
kubectl get pods -o custom-columns='POD:.metadata.name,NODE:.spec.nodeName,GPUS:.spec.containers[*].resources.limits.nvidia\.com/gpu,PHASE:.status.phase'
kubectl delete rolloutjob --all --wait=true
children() { kubectl get deploy,rs,pod,svc,cm -l app.kubernetes.io/managed-by=treadle-operator -o name | wc -l; }
echo "children right after delete: $(children); the garbage collector removes them through ownerReferences"
for _ in $(seq 120); do [ "$(children)" -eq 0 ] && break; sleep 0.5; done
echo "children left: $(children)"

section "2/3 Local rollout: math-tool job, every service a process on 127.0.0.1"
"$TREADLE" run manifests/examples/math-tool-h20.yaml --interval 5

section "3/3 Learning loop: GRPO on a tiny Llama, real vLLM on CPU, weights hot-swapped every step"
"$TREADLE" train
