"""``treadle weights ...``: run a store process, or inspect what is published under a prefix."""

from __future__ import annotations

import argparse
import json
from typing import Any

from treadle import errors
from treadle.weights import mooncake_client, objects, pull, store


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("weights", help="weight publication: store processes and inspection")
    sub = parser.add_subparsers(dest="weights_command", metavar="WEIGHTS_COMMAND", required=True)
    serve = sub.add_parser("store", help="run a Mooncake store process that lends memory to the pool")
    store.add_arguments(serve)
    serve.set_defaults(func=store.run)
    show = sub.add_parser("show", help="print the latest (or a given) committed version's manifest summary")
    show.add_argument("--prefix", required=True)
    show.add_argument("--version", type=int, default=None)
    where = show.add_mutually_exclusive_group(required=True)
    where.add_argument("--dir", help="a local FileStore directory")
    where.add_argument("--master", help="mooncake_master RPC address (needs --metadata)")
    show.add_argument("--metadata", help="Mooncake metadata URL")
    show.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    target: objects.ObjectStore
    if args.dir is not None:
        target = objects.FileStore(args.dir)
    else:
        if args.metadata is None:
            print("--metadata is required with --master")
            return 2
        target = mooncake_client.MooncakeStore(mooncake_client.MooncakeConfig(args.master, args.metadata))
    try:
        reader = pull.Reader(target, args.prefix)
        version = args.version if args.version is not None else reader.latest()
        if version is None:
            print(json.dumps({"prefix": args.prefix, "latest": None}))
            return 1
        manifest = reader.manifest(version)
        reader.close()
    except errors.TreadleError as exc:
        print(f"treadle weights show: {exc}")
        return 1
    finally:
        target.close()
    summary = {
        "prefix": args.prefix, "version": manifest.version, "published_at": manifest.published_at,
        "buckets": len(manifest.buckets), "tensors": len(manifest.tensors), "bytes": manifest.total_bytes,
    }  # fmt: skip
    print(json.dumps(summary))
    return 0
