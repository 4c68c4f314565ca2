"""A trainer process for the kill-mid-publish test: publishes v1, then v2 and stalls after bucket 2.

Run as ``python trainer_proc.py MASTER METADATA PREFIX``; prints ``committed 1`` and then
``v2 bucket 2`` and waits on stdin, so the test can SIGKILL it between buckets, deterministically.
"""

from __future__ import annotations

import sys

import numpy as np

from treadle.weights import mooncake_client, publish


def state(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"w{i}": rng.standard_normal(64 * 1024).astype(np.float32) for i in range(6)}  # 256 KiB each


def main() -> None:
    master, metadata, prefix = sys.argv[1:4]
    store = mooncake_client.MooncakeStore(mooncake_client.MooncakeConfig(master, metadata))

    def stall(index: int, count: int) -> None:
        if index == 2:
            print("v2 bucket 2", flush=True)
            sys.stdin.readline()

    publish.Publisher(store, prefix, bucket_bytes=256 * 1024).publish(state(1), 1)
    print("committed 1", flush=True)
    publish.Publisher(store, prefix, bucket_bytes=256 * 1024, on_bucket=stall).publish(state(2), 2)
    print("committed 2", flush=True)


if __name__ == "__main__":
    main()
