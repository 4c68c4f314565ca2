"""The Treadle operator (``treadle.operator``): RolloutJob -> owned children, status and Events.

Modules, from pure to I/O:

- ``config``: operator-wide settings (images, ports, shared backends) read from ``TREADLE_*``.
- ``render``: pure renderers of every child; ``diff``: what to apply or delete.
- ``status`` / ``reasons``: pure status computation with machine-readable reasons.
- ``reshape``: pure mapping of a Heddle TP plan onto a job's pools (``treadle operator reshape``).
- ``metrics``: Prometheus collectors on the operator's own registry.
- ``kube``: the few API calls (server-side apply, list, delete, status and job patches, nodes).
- ``runtime``: state shared by handlers (kopf's memo).
- ``handlers``: the kopf handlers (registered on import); ``cli``: ``treadle operator run``.
"""
