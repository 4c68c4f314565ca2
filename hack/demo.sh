#!/usr/bin/env bash
# `make demo`: Treadle's vertical slice, in three parts.
#   1. Kubernetes: a real control plane (etcd, kube-apiserver, controller-manager, scheduler) whose
#      process nodes run every pod; helm install, then manifests/dev/learn.yaml trains a tiny model
#      with real vLLM (CPU) and the reference GRPO trainer as pods (needs root: pod network namespaces).
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
cleanup() {
  "$TREADLE" cluster --name treadle-demo --kubeconfig "$KUBECONFIG" down
}
trap cleanup EXIT

section "1/3 Kubernetes: helm install, then a RolloutJob that really trains (every pod runs as processes)"
echo "One CPU process node and one with SIMULATED H20 GPUs (no device: vLLM runs its CPU build there)."
"$TREADLE" cluster --name treadle-demo --kubeconfig "$KUBECONFIG" up --nodes 0 --run-nodes 1 --run-gpu-nodes 1
kubectl get nodes -L treadle.dev/accelerator -L nvidia.com/gpu.product
# The dev cluster's nodes have no volume provisioner: Redis keeps its AOF on an emptyDir here.
"$BIN/helm" upgrade --install treadle charts/treadle --namespace treadle-system --create-namespace --wait --timeout 120s \
  --set redis.persistence.enabled=false
kubectl get pods -n treadle-system -o wide
install -D manifests/dev/data/letters.jsonl /var/lib/treadle/datasets/letters.jsonl
"$VENV/bin/python" -c 'from treadle.trainer import policy; policy.ensure_model(policy.model_dir(0))'
# The node's local weight store outlives jobs (a hostPath the operator cannot reach): an earlier
# demo's versions (under its job's uid, so never read by this one) would only take disk.
rm -rf /var/lib/treadle/weights/default/learn
kubectl apply -f manifests/dev/learn.yaml
echo "kubectl get rolloutjobs, on every change (vLLM on CPU needs 1-2 min before the first step):"
last="" trained=""
for _ in $(seq 1800); do
  row="$(kubectl get rolloutjobs learn --no-headers 2>/dev/null || true)"
  [ "$row" != "$last" ] && echo "  $row" && last="$row"
  [ "$(kubectl get rolloutjob learn -o 'jsonpath={.status.step}' 2>/dev/null)" = 20 ] && trained=1 && break
  sleep 1
done
if [ -z "$trained" ]; then
  echo "demo: the job did not reach step 20 in 30 min; treadle status says:" >&2
  "$TREADLE" status learn -n default --kubeconfig "$KUBECONFIG" >&2 || true
  exit 1
fi
echo "  $(kubectl get rolloutjobs learn --no-headers)"
kubectl get pods -o custom-columns='POD:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase,RANK:.metadata.labels.batch\.kubernetes\.io/job-completion-index'
# The scheduler's counts reach the job's status on its next report (every few seconds).
for _ in $(seq 30); do
  [ -n "$(kubectl get rolloutjob learn -o 'jsonpath={.status.rollout.completed}' 2>/dev/null)" ] && break
  sleep 1
done
echo "treadle status learn (the operator's view and the scheduler's own counts):"
"$TREADLE" status learn -n default --kubeconfig "$KUBECONFIG"
echo "the trainer pod's log (mean reward per step):"
kubectl logs -l treadle.dev/job=learn,treadle.dev/component=trainer --tail=-1 | grep '^step'
kubectl delete rolloutjob learn --wait=true
children() { kubectl get deploy,rs,pod,svc,cm,job -l app.kubernetes.io/instance=learn -o name | wc -l; }
for _ in $(seq 120); do [ "$(children)" -eq 0 ] && break; sleep 0.5; done
echo "children left after deleting the job: $(children)"

section "2/3 Local rollout: math-tool job, every service a process on 127.0.0.1"
"$TREADLE" run manifests/examples/math-tool-h20.yaml --interval 5

section "3/3 Learning loop: GRPO on a tiny Llama, real vLLM on CPU, weights hot-swapped every step"
"$TREADLE" train
