"""The simulator's folded roofline equals the cost model it folds, on every accelerator and TP."""

from __future__ import annotations

import itertools

import pytest

from treadle.policy import costmodel
from treadle.sim import cost


@pytest.mark.parametrize(
    "acc,shape,tp",
    list(itertools.product(costmodel.ACCELERATORS.values(), costmodel.MODELS.values(), [1, 2, 4])),
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_roofline_matches_costmodel(acc: costmodel.Accelerator, shape: costmodel.ModelShape, tp: int) -> None:
    engine = cost.Roofline(acc, shape, tp)
    for batch, context in [(1, 0), (7, 12_000), (128, 500_000)]:
        assert engine.decode_step(batch, context) == pytest.approx(
            costmodel.decode_step_time(acc, shape, batch=batch, context_tokens=context, tp=tp), rel=1e-12
        )
    for new, cached in [(1, 0), (300, 9000), (32_000, 0)]:
        flops = engine.prefill_flops(new, cached)
        assert flops == pytest.approx(
            costmodel.prefill_flops(shape, new_tokens=new, cached_tokens=cached), rel=1e-12
        )
        assert engine.prefill_batch(flops=flops, kv_tokens=new + cached, new_tokens=new) == pytest.approx(
            costmodel.prefill_time(acc, shape, new_tokens=new, cached_tokens=cached, tp=tp), rel=1e-12
        )
    assert engine.decode_step(0, 0) == engine.prefill_batch(flops=0, kv_tokens=0, new_tokens=0) == 0.0


def test_train_time_reproduces_fig3_calibration() -> None:
    # RollArt Fig. 3: 84.1 s for 128 SWE trajectories of ~20k tokens on 32 H800 (Qwen3-8B)
    t = cost.train_time(costmodel.QWEN3_8B, tokens=128 * 20_000, gpus=32, acc=costmodel.H800)
    assert t == pytest.approx(84.1, rel=0.01)


def test_weight_sync_modes() -> None:
    q8 = costmodel.QWEN3_8B
    assert cost.weight_sync_s("mooncake", q8) == pytest.approx((1.4, 32.4), rel=0.01)  # Table 4
    assert cost.weight_sync_s("naive", q8) == pytest.approx((38.6, 0.0), rel=0.01)  # Table 4 naive
    assert cost.weight_sync_s("nccl", q8) == pytest.approx((5.466, 0.0), rel=0.01)  # Table 3 RDMA
