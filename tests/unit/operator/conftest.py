"""Fixtures for operator unit tests."""

from __future__ import annotations

import operator_examples
import pytest

from treadle.api import v1alpha1


@pytest.fixture
def math_job() -> v1alpha1.RolloutJob:
    return operator_examples.load_example(
        operator_examples.ROOT / "manifests" / "examples" / "math-tool-h20.yaml"
    )
