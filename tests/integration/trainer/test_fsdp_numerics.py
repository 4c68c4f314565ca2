"""FSDP2 over two gloo ranks makes the step one plain process makes: same loss, same weights, same Adam.

Each case runs ``fsdp_worker.py`` under ``torchrun`` (2 processes, real torch.distributed on gloo,
127.0.0.1), which trains one GRPO step of the tiny Llama and publishes it from the shards (each rank
its own rows, several buckets each, rank 0 the manifest). The reference is the same step in this
process with no sharding at all: one forward over every sequence, the token-level mean, Adam. The
published version is read back through ``weights.pull`` (which assembles the parts), so the test also
proves that what engines and restarts read is the trained model. With micro-batches of 12 tokens the
ranks run several forward/backward passes each, and one rank runs an empty one (zero weight).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import torch

from treadle.testing import procs
from treadle.trainer import grpo, policy, step
from treadle.weights import objects, pull

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fsdp_worker

pytestmark = pytest.mark.timeout(600)
TOLERANCE = 1e-5


def reference(model_dir: pathlib.Path) -> tuple[float, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Loss, weights and Adam's first moments after the step, in one process without FSDP."""
    torch.manual_seed(0)
    pol = policy.load(model_dir)
    batch = fsdp_worker.batch()
    seqs, owner = step.sequences(batch)
    advantages = grpo.group_advantages(batch.rewards, [s.group_id for s in batch.samples])
    scored = policy.token_logprobs(pol, [(p, o) for p, o, _ in seqs])
    behaviour = torch.zeros_like(scored.logprobs)
    for row, (_, _, lps) in enumerate(seqs):
        behaviour[row, : len(lps)] = torch.tensor(lps)
    adv = torch.tensor([advantages[i] for i in owner])
    loss, _ = grpo.policy_loss(scored.logprobs, behaviour, adv, scored.mask)
    adam = torch.optim.Adam(pol.model.parameters(), lr=fsdp_worker.LR)
    adam.zero_grad()
    loss.backward()
    adam.step()
    names = {id(p): n for n, p in pol.model.named_parameters()}
    moments = {names[id(p)]: s["exp_avg"] for p, s in adam.state.items()}
    return float(loss), dict(pol.model.state_dict()), moments


def run_ranks(model_dir: pathlib.Path, store: pathlib.Path, ranks: int, micro: int | None) -> dict[str, Any]:
    port = procs.free_port()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
        "--master-addr=127.0.0.1", f"--master-port={port}",
        str(pathlib.Path(fsdp_worker.__file__)), str(model_dir), str(store), *([str(micro)] if micro else []),
    ]  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("{")]
    result: dict[str, Any] = json.loads(line)
    return result


@pytest.mark.parametrize("micro", [None, 12], ids=["whole-share", "micro-batches-of-12-tokens"])
def test_two_ranks_match_one_process(
    tmp_path: pathlib.Path, tiny_model_dir: pathlib.Path, micro: int | None
) -> None:
    want_loss, want_weights, want_moments = reference(tiny_model_dir)
    got = run_ranks(tiny_model_dir, tmp_path / "store", 2, micro)
    assert abs(got["stats"]["loss"]["loss"] - want_loss) <= TOLERANCE, (got["stats"], want_loss)
    assert got["stats"]["micro_batches"] == (1 if micro is None else 3)
    assert got["buckets"] > 2  # both ranks wrote buckets of their own
    store = objects.FileStore(tmp_path / "store")
    weights = pull.Reader(store, fsdp_worker.PREFIX).pull(1, kind="torch").tensors
    assert set(weights) == set(want_weights)
    worst = max(float((weights[k] - want_weights[k]).abs().max()) for k in want_weights)
    assert worst <= TOLERANCE, worst
    moved = max(
        float((weights[k] - before).abs().max())
        for k, before in policy.load(tiny_model_dir).model.state_dict().items()
    )
    assert moved > 1e-3  # the step changed the weights: the comparison is not of two untouched models
    state = pull.Reader(store, f"{fsdp_worker.PREFIX}/optimizer_state").pull(1, kind="torch").tensors
    for name, moment in want_moments.items():
        assert float((state[f"{name}.exp_avg"] - moment).abs().max()) <= TOLERANCE, name
