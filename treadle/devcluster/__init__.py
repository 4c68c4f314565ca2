"""A real Kubernetes control plane on one machine, with fake GPU node pools.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are real binaries (built from
the Go module proxy by ``hack/build-k8s.sh``); only the nodes are fake, run by KWOK. Used by the
e2e test tier, by ``make cluster-up`` and by people trying Treadle without a GPU cluster.
"""
