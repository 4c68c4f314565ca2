"""``treadle render FILE`` and ``treadle status JOB``: what a job will create, and where it stands.

``render`` parses each RolloutJob of a file exactly as the operator does (``v1alpha1.parse_job``)
and prints what ``treadle.operator.render.render_children`` returns for it under the operator's
configuration from the environment (``OperatorConfig.from_env``, as ``treadle operator run``
builds it), so the output is what the operator would apply; the only field it cannot know is the
job's ``uid`` in each ownerReference, which the API server assigns. ``status`` reads the job and
its children from the API server and prints ``treadle.operator.explain``'s report.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from treadle import errors
from treadle.api import v1alpha1
from treadle.operator import config, explain, jobreader, render


def register(sub: Any) -> None:
    ren: argparse.ArgumentParser = sub.add_parser(
        "render",
        help="print every object the operator would create for a RolloutJob",
        description="Validate each RolloutJob in FILE as the operator does and print the children "
        "it would apply (the operator's own renderers, its configuration read from TREADLE_* as "
        "in its pod). Exit 2 on an invalid job, naming the field.",
    )
    ren.add_argument(
        "file", type=Path, metavar="FILE", help="RolloutJob manifest (YAML or JSON, '-' for stdin)"
    )
    ren.add_argument(
        "--namespace", "-n", default=None, help="namespace of the job (default: the file's, else default)"
    )
    ren.add_argument(
        "--output", "-o", choices=("yaml", "json"), default="yaml", help="yaml stream or a JSON List"
    )
    ren.set_defaults(func=_render)
    st = sub.add_parser(
        "status",
        help="where a RolloutJob is and what blocks it",
        description="Phase, conditions, pools, step and policy version of a RolloutJob, and what "
        "keeps it from progressing: unschedulable or crash-looping pods, pools not ready, a reward "
        "gateway at zero with work waiting, a feeder that cannot read a dataset.",
    )
    st.add_argument("job", help="RolloutJob name")
    st.add_argument("--namespace", "-n", default="default", help="the job's namespace")
    st.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster, else $KUBECONFIG)")
    st.set_defaults(func=_status)


def _jobs(path: Path, namespace: str | None) -> list[v1alpha1.RolloutJob]:
    """Every RolloutJob document of the file, validated; ``SpecError`` names the first bad field."""
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    out = []
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        if not isinstance(doc, dict):
            raise errors.SpecError("a document must be a RolloutJob object", field="<document>", value=doc)
        if namespace is not None:
            doc = {**doc, "metadata": {**(doc.get("metadata") or {}), "namespace": namespace}}
        out.append(v1alpha1.parse_job(doc))
    return out


def _render(args: argparse.Namespace) -> int:
    try:
        jobs = _jobs(args.file, args.namespace)
    except errors.SpecError as exc:
        print(f"{args.file}: {exc}", file=sys.stderr)
        return 2
    except (OSError, yaml.YAMLError) as exc:
        print(f"{args.file}: cannot read: {exc}", file=sys.stderr)
        return 2
    cfg = config.OperatorConfig.from_env()
    objects = [obj for job in jobs for obj in render.render_children(job, cfg)]
    if args.output == "json":
        sys.stdout.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
    return 0


def _status(args: argparse.Namespace) -> int:
    try:
        reader = jobreader.Reader.from_environment(args.kubeconfig)
        snapshot = reader.snapshot(args.namespace, args.job)
    except jobreader.NotFoundError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    sys.stdout.write(explain.format_report(explain.explain(snapshot)))
    return 0
