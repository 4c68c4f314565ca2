"""The worked 8-GPU trainer spec of ``docs/TRAINING.md`` is a valid RolloutJob and renders as it says.

The spec is read from the page itself, merged into the math-tool example (whose agent serves
Qwen3-8B): eight ranks in one pod under ``torchrun``, eight GPUs, bf16 compute, and the knobs the page
names reaching the trainer's configuration.
"""

from __future__ import annotations

import re
from typing import Any

import operator_examples
import yaml

from treadle.api import jobconfig, nodes, v1alpha1
from treadle.operator import config, render

PAGE = operator_examples.ROOT / "docs" / "TRAINING.md"
EXAMPLE = operator_examples.ROOT / "manifests" / "examples" / "math-tool-h20.yaml"


def worked_spec() -> dict[str, Any]:
    section = PAGE.read_text().split("## A worked spec", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block, "docs/TRAINING.md lost its worked spec"
    spec: dict[str, Any] = yaml.safe_load(block.group(1))["spec"]
    return spec


def test_the_worked_spec_renders_eight_ranks_on_eight_gpus() -> None:
    spec = worked_spec()
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] |= {"namespace": "team-a", "uid": "uid-doc", "generation": 1}
    doc["spec"]["agents"][0]["model"] = spec["agents"][0]["model"]
    doc["spec"]["trainer"] = spec["trainer"]
    job = v1alpha1.parse_job(doc)
    (trainer_job,) = [c for c in render.render_children(job, config.OperatorConfig()) if c["kind"] == "Job"]
    (container,) = trainer_job["spec"]["template"]["spec"]["containers"]
    assert container["command"][:4] == ["python", "-m", "torch.distributed.run", "--module"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("1", "8")
    assert container["resources"]["limits"][nodes.GPU_RESOURCE] == "8"
    cfg = jobconfig.job_config(job, max_tokens=64, max_in_flight=64, max_concurrent_generations=8).trainer
    assert cfg is not None and cfg.bf16 and cfg.activation_checkpointing
    assert (cfg.micro_batch_tokens, cfg.max_grad_norm, cfg.model) == (16384, 1.0, "Qwen/Qwen3-8B")
