"""The committed CRD copies equal what ``treadle.api.crd`` generates, and its schema is structural."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from treadle.api import crd, spec_rules

ROOT = Path(__file__).resolve().parents[3]


def test_committed_crds_match_the_models() -> None:
    for path, text in crd.expected_files(ROOT).items():
        assert path.is_file(), f"{path} missing: run `treadle crd --write`"
        assert path.read_text() == text, f"{path} drifted from treadle/api: run `treadle crd --write`"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for key, sub in node.get("properties", {}).items():
            out += _walk(sub, f"{path}.{key}")
        if "items" in node:
            out += _walk(node["items"], f"{path}[]")
    return out


def test_schema_is_structural() -> None:
    """Every node has a type, no $ref/anyOf/title survives, objects are not open-ended; the one
    exception is int-or-string (a quantity), exactly in the form the API server allows."""
    schema = crd.render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        if node.get(crd.INT_OR_STRING):
            assert "type" not in node, path
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "type" in node, path
            assert "anyOf" not in node, path
        for banned in ("$ref", "allOf", "title", "$defs"):
            assert banned not in node, (path, banned)
        if node.get("additionalProperties") is False:
            raise AssertionError(f"{path}: additionalProperties false is not structural")


def test_every_field_has_a_description() -> None:
    schema = crd.spec_schema()
    missing = [p for p, node in _walk(schema) if p and not p.endswith("[]") and not node.get("description")]
    assert missing == []


def test_object_defaults_spell_out_nested_defaults() -> None:
    """The API server validates defaults as written, so CEL rules must find every key they read."""
    reward = crd.spec_schema()["properties"]["reward"]
    assert reward["default"] == {"type": "rule", "minReplicas": 0, "maxReplicas": 4, "scaleToZero": True}


def test_every_rule_is_attached_with_its_message() -> None:
    schema = crd.spec_schema()
    attached = [
        (rule["rule"], rule["message"])
        for _, node in _walk(schema)
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert sorted(attached) == sorted((r.cel, r.message) for r in spec_rules.SPEC_RULES)


def test_named_lists_are_maps_so_duplicates_are_rejected() -> None:
    props = crd.spec_schema()["properties"]
    for key in ("agents", "pools", "tasks"):
        assert props[key]["x-kubernetes-list-type"] == "map"
        assert props[key]["x-kubernetes-list-map-keys"] == ["name"]


def test_tp_enum_and_exclusive_bounds_use_openapi_v3_forms() -> None:
    props = crd.spec_schema()["properties"]
    tp = props["pools"]["items"]["properties"]["tensorParallelSize"]
    assert tp["type"] == "integer" and tp["enum"] == [1, 2, 4, 8]
    weight = props["tasks"]["items"]["properties"]["weight"]
    assert weight["minimum"] == 0.0 and weight["exclusiveMinimum"] is True


def test_printer_columns_and_status_subresource() -> None:
    version = crd.render_crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Phase", "Pools", "Policy", "Step", "Reward", "Reason", "Age"]


def test_chart_copy_is_guarded_and_kept() -> None:
    text = crd.render_yaml(chart=True)
    assert text.splitlines()[1] == crd.CHART_GUARD_OPEN.strip()
    body = yaml.safe_load("\n".join(text.splitlines()[2:-1]))
    assert body["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_the_chart_copy_keeps_literal_braces_out_of_helms_way() -> None:
    """``spec.tasks[].dataset.promptTemplate``'s description shows ``{{``: Helm must not read it."""
    plain, chart = crd.render_yaml(), crd.render_yaml(chart=True)
    assert "``{{`` and ``}}``" in plain
    assert '``{{"{{"}}`` and ``{{"}}"}}``' in chart  # each renders to itself
    inner = chart.removeprefix(crd.HEADER + crd.CHART_GUARD_OPEN).removesuffix(crd.CHART_GUARD_CLOSE)
    assert "{{-" not in inner and "{{ " not in inner  # no other action is left in the body


def test_defaults_satisfy_their_own_schema_and_no_const_reaches_the_api_server() -> None:
    """The API server rejects a CRD whose default breaks its own bounds, and has no ``const``."""

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            assert "const" not in node, f"{path}: structural schemas have no const (use enum)"
            default = node.get("default")
            if isinstance(default, list):
                assert len(default) >= node.get("minItems", 0), f"{path}: default {default} below minItems"
            # A null inside a default is refused (the resources defaults once carried limits.cpu: null).
            if "default" in node:
                assert "None" not in repr(default) and "null" not in json.dumps(default), f"{path}: {default}"
            for key, sub in node.items():
                walk(sub, f"{path}.{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                walk(sub, f"{path}[{i}]")

    walk(crd.spec_schema(), "spec")
