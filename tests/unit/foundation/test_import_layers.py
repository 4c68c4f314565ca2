"""The import contracts in ``.importlinter`` refuse each wrong-way import that issue 13 removed.

The repo's own contracts are checked in-process on treadle's real import graph (what ``lint-imports``
builds), once as it is (every contract kept) and once per wrong import re-added to a copy of that
graph as an edge: each must break the contract that holds the fix. A contract that stopped covering
its fix (a typo in a module name, a too-wide ``ignore_imports``) fails here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter import api
from importlinter.contracts import forbidden, independence, layers

CONFIG = Path(__file__).resolve().parents[3] / ".importlinter"
CONTRACT_TYPES: dict[str, Any] = {
    "layers": layers.LayersContract,
    "independence": independence.IndependenceContract,
    "forbidden": forbidden.ForbiddenContract,
}

# (importer, imported, the contract id that must refuse it)
WRONG_IMPORTS = {
    # The production operator took its node labels and taints from the dev cluster tools.
    "operator-imports-devcluster": ("treadle.operator.render", "treadle.devcluster.nodes", "layers"),
    "operator-kube-imports-devcluster": ("treadle.operator.kube", "treadle.devcluster.nodes", "layers"),
    # Placement's rebalancer imported the agent's swap module, and the agent placement's server side.
    "placement-imports-agent-swap": (
        "treadle.services.placement.rebalance", "treadle.services.agent.swap", "services-independent",
    ),
    "agent-imports-placement-server": (
        "treadle.services.agent.reporter", "treadle.services.placement.service", "services-independent",
    ),
    "scheduler-imports-buffer-server": (
        "treadle.services.scheduler.service", "treadle.services.buffer.service", "services-independent",
    ),
    # A service's public face must not load its server.
    "client-imports-its-server": (
        "treadle.services.agent.client", "treadle.services.agent.service", "service-faces-stand-alone",
    ),
    # Services reaching up into local mode (the jobconfig branch removes the last two such imports).
    "service-imports-localmode": ("treadle.services.buffer.service", "treadle.localmode.plan", "layers"),
    "policy-imports-api": ("treadle.policy.placement", "treadle.api.v1alpha1", "layers"),
    "sim-imports-services": ("treadle.sim.engine", "treadle.services.scheduler.protocol", "layers"),
}  # fmt: skip


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("treadle", include_external_packages=True, cache_dir=None)


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return api.read_configuration(str(CONFIG))


def broken(graph: grimp.ImportGraph, config: dict[str, Any]) -> set[str]:
    """Ids of the contracts in ``config`` that ``graph`` breaks."""
    out = set()
    for options in config["contracts_options"]:
        contract = CONTRACT_TYPES[options["type"]](
            name=options["name"], session_options=config["session_options"], contract_options=options
        )
        if not contract.check(copy.deepcopy(graph), verbose=False).kept:
            out.add(options["id"])
    return out


def test_treadle_keeps_every_contract(graph: grimp.ImportGraph, config: dict[str, Any]) -> None:
    assert {o["type"] for o in config["contracts_options"]} <= set(CONTRACT_TYPES)
    assert broken(graph, config) == set()


@pytest.mark.parametrize("importer,imported,contract", WRONG_IMPORTS.values(), ids=list(WRONG_IMPORTS))
def test_a_wrong_import_readded_breaks_its_contract(
    graph: grimp.ImportGraph, config: dict[str, Any], importer: str, imported: str, contract: str
) -> None:
    assert importer in graph.modules, f"{importer} is gone: update this case"
    wrong = copy.deepcopy(graph)
    wrong.add_import(importer=importer, imported=imported, line_number=1, line_contents="# re-added")
    assert contract in broken(wrong, config)


def test_a_new_top_level_module_must_pick_a_layer(graph: grimp.ImportGraph, config: dict[str, Any]) -> None:
    wrong = copy.deepcopy(graph)
    wrong.add_module("treadle.newtool")
    assert "layers" in broken(wrong, config)
