"""Fixtures of the data-plane integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from treadle.localmode import stack as stack_mod


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[stack_mod.Stack]:
    """A local-mode process stack under the test's directory, stopped at the end."""
    with stack_mod.Stack(tmp_path / "run") as s:
        yield s
