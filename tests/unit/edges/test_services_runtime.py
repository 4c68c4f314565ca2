"""runtime.settle_heap: what startup built leaves the collector's generations; full collections rarer."""

from __future__ import annotations

import gc

from treadle.services import runtime


def test_settle_heap_freezes_startup_and_keeps_young_thresholds() -> None:
    before = gc.get_threshold()
    built_at_startup = [{"kept": i} for i in range(1000)]
    try:
        runtime.settle_heap()
        assert gc.get_freeze_count() >= len(built_at_startup)
        assert not any(o is built_at_startup for o in gc.get_objects())  # no generation holds it now
        assert gc.get_threshold() == (before[0], before[1], runtime.FULL_COLLECTION_EVERY)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
