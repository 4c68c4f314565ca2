"""A node agent that runs the pods bound to its nodes as local processes (the dev cluster's kubelet).

KWOK nodes only pretend to run pods; the process nodes this agent registers run them for real,
from the pod objects read back from the API server: each pod's containers become processes with
the rendered command, args, env, volumes and probes, inside a network namespace per pod (so the
containers of a pod share 127.0.0.1 and two pods can bind the same port), a mount and UTS
namespace per container, Services resolvable by the agent's DNS, and the API server reachable the
in-cluster way. See ``agent`` (nodes and the sync loop), ``pod`` (one pod's lifecycle), ``net``,
``launch``, ``inputs``, ``probes``, ``images``, ``dns``, ``proxy`` and ``logs``.

What differs from a kubelet with a container runtime, by design of a dev tool:
- no images: each known image maps to this machine's Treadle virtualenv or a Debian binary
  (``images``); an unknown image leaves the container waiting with reason ``ErrImageNeverPull``;
- the containers see the host's file system (plus their volumes and ``/etc`` files), run as root
  (``securityContext.runAsUser`` is not applied: the virtualenv lives under ``/root``) and have no
  cgroup limits (``resources`` are scheduling input only);
- no kube-proxy: Service names resolve straight to ready pod IPs, so a Service's port must equal
  its target port;
- GPUs on a process node are SIMULATED capacity (annotation ``treadle.dev/simulated-gpus``);
- of the kubelet API only the log route (``logs``): ``kubectl logs`` works, ``kubectl exec`` does not.
"""
