"""The roofline cost model pinned on hand-computed cases and on RollArt's measured ratios."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.policy import costmodel

H800, H20, Q8B, Q32B = costmodel.H800, costmodel.H20, costmodel.QWEN3_8B, costmodel.QWEN3_32B


def test_decode_batch_one_is_the_weight_read() -> None:
    # bytes = 8.19e9 params * 2 B = 16.38e9; H800 effective BW = 3.35e12 * 0.80 = 2.68e12 B/s
    # memory term 16.38e9 / 2.68e12 = 6.1119403e-3 s >> compute 2*8.19e9 / (989.5e12*0.508) = 3.26e-5 s
    # plus the 1.5 ms step overhead
    t = costmodel.decode_step_time(H800, Q8B, batch=1, context_tokens=0)
    assert t == pytest.approx(16.38e9 / 2.68e12 + 1.5e-3, rel=1e-9)
    assert t == pytest.approx(0.0076119403, rel=1e-7)


def test_decode_step_line_is_the_kv_read_per_sequence_when_memory_bound() -> None:
    # Qwen3-14B on H800 at 16K tokens a sequence: KV 2*40*8*128*2 = 163,840 B a token, so a
    # sequence adds 163840 * 16384 / 2.68e12 = 1.0017 ms; the intercept is the weight read
    # 2 * 14.77e9 / 2.68e12 = 11.022 ms plus the 1.5 ms step overhead. Memory bound up to 64:
    # compute (2*14.77e9 + 4*40*5120*16384) * 64 / (989.5e12 * 0.508) = 5.5 ms < 75 ms of reads
    q14 = costmodel.QWEN3_14B
    intercept, per_seq = costmodel.decode_step_line(H800, q14, context_tokens=16384, max_batch=64)
    assert per_seq == pytest.approx(163840 * 16384 / 2.68e12, rel=1e-9)
    assert intercept == pytest.approx(2 * 14.77e9 / 2.68e12 + 1.5e-3, rel=1e-9)
    for batch in (1, 8, 64):
        exact = costmodel.decode_step_time(H800, q14, batch=batch, context_tokens=16384 * batch)
        assert intercept + per_seq * batch == pytest.approx(exact, rel=1e-9)
    with pytest.raises(errors.SpecError) as err:
        costmodel.decode_step_line(H800, q14, context_tokens=1, max_batch=1)
    assert err.value.field == "max_batch"


def test_prefill_is_compute_bound_on_h20() -> None:
    # flops = 2*8.19e9*1000 + 4*36 layers*4096 attn dim*1000*(0 + 1001/2) = 1.638e13 + 2.95206912e11
    # H20 effective = 148e12 * 0.60 = 8.88e13 FLOP/s -> 0.18778386 s, plus 1.5 ms
    flops = costmodel.prefill_flops(Q8B, new_tokens=1000)
    assert flops == pytest.approx(1.6675206912e13, rel=1e-12)
    t = costmodel.prefill_time(H20, Q8B, new_tokens=1000)
    assert t == pytest.approx(1.6675206912e13 / 8.88e13 + 1.5e-3, rel=1e-9)


def test_prefix_cache_makes_prefill_cheaper_but_attention_still_sees_the_context() -> None:
    cold = costmodel.prefill_time(H800, Q8B, new_tokens=8000)
    warm = costmodel.prefill_time(H800, Q8B, new_tokens=200, cached_tokens=7800)
    only_new = costmodel.prefill_time(H800, Q8B, new_tokens=200)
    assert warm < cold / 10
    assert warm > only_new


def test_tensor_parallel_adds_two_allreduces_per_layer() -> None:
    # Qwen3-32B, TP 2, batch 10: 2 * 64 layers * (8e-6 s + 2*(1/2)*10 tok*5120*2 B / 400e9 B/s)
    #   = 128 * (8e-6 + 2.56e-7) = 1.056768e-3 s on top of the roofline split over 2 GPUs
    tp1 = costmodel.decode_step_time(H800, Q32B, batch=10, context_tokens=0, tp=1)
    tp2 = costmodel.decode_step_time(H800, Q32B, batch=10, context_tokens=0, tp=2)
    roofline_tp1 = tp1 - 1.5e-3
    assert tp2 == pytest.approx(roofline_tp1 / 2 + 1.5e-3 + 1.056768e-3, rel=1e-9)


def test_kv_capacity_hand_computed() -> None:
    # H800: 80e9*0.9 - 2e9 reserve - 16.38e9 weights = 53.62e9 B; 2*36*8*128*2 = 147456 B/token
    assert Q8B.kv_bytes_per_token == 147456
    assert costmodel.kv_capacity_tokens(H800, Q8B) == 363633
    # Qwen3-32B on one H800: 72e9 - 2e9 - 65.52e9 = 4.48e9 B / 262144 B/token = 17089 tokens, less
    # than one 32k context -- why RollArt runs it at TP 4; weights bigger than HBM leave nothing
    assert costmodel.kv_capacity_tokens(H800, Q32B, tp=1) == 17089
    assert costmodel.kv_capacity_tokens(H800, Q32B, tp=4) == (4 * 70e9 - 65.52e9) // 262144
    big = costmodel.ModelShape(
        "big", params=100e9, layers=80, hidden=8192, q_heads=64, kv_heads=8, head_dim=128
    )
    assert costmodel.kv_capacity_tokens(H800, big) == 0


@pytest.mark.parametrize("total_batch", [6, 12, 48, 192, 384])
def test_prefill_reproduces_fig4_053(total_batch: int) -> None:
    # RollArt Fig. 4a: prefill-heavy work on 2×H800 takes "as low as 0.53×" the time on 6×H20
    ratio = costmodel.cost_equivalent_ratio("prefill", total_batch=total_batch, context_tokens=0)
    assert ratio == pytest.approx(0.53, abs=0.005)


def test_decode_spans_fig4_049_to_079_over_batch_sizes() -> None:
    # RollArt Fig. 4b: decode-heavy work on 6×H20 takes 0.49-0.79× the time on 2×H800
    batches = [32, 48, 64, 96, 128, 192, 256]
    h20_over_h800 = [
        1 / costmodel.cost_equivalent_ratio("decode", total_batch=b, context_tokens=2000) for b in batches
    ]
    assert all(0.48 <= r <= 0.79 for r in h20_over_h800), h20_over_h800
    assert h20_over_h800 == sorted(h20_over_h800, reverse=True)  # bigger batches favour H20 more
    assert h20_over_h800[0] > 0.75 and h20_over_h800[-1] < 0.50  # both ends of the paper's range


@pytest.mark.parametrize(
    "path,size,want",
    [
        ("push", 15.26, 32.4),  # Table 4, Qwen3-8B
        ("pull", 27.51, 16.3),  # Table 4, Qwen3-14B
        ("exposed-pull", 61.02, 9.6),  # Table 4, Qwen3-32B
        ("tcp", 27.51, 14.437),  # Table 3
        ("rdma", 61.02, 9.442),  # Table 3
        ("naive", 21.385, (38.6 + 84.1) / 2),  # halfway between 8B and 14B: linear
        ("push", 122.04, 127.3 + (127.3 - 67.8) * (61.02 / 33.51)),  # beyond 32B: last segment
    ],
    ids=["push-8b", "pull-14b", "exposed-32b", "tcp-14b", "rdma-32b", "between", "beyond"],
)
def test_transfer_matches_tables_3_and_4(path: str, size: float, want: float) -> None:
    assert costmodel.transfer_time(path, size) == pytest.approx(want, rel=1e-9)


def test_weight_sizes_match_table_3() -> None:
    assert costmodel.weight_gib(Q8B) == pytest.approx(15.26, abs=0.02)
    assert costmodel.weight_gib(costmodel.QWEN3_14B) == pytest.approx(27.51, abs=0.02)
    assert costmodel.weight_gib(Q32B) == pytest.approx(61.02, abs=0.02)


def test_trajectory_cost_one_turn_pure_prefill() -> None:
    # 1 turn, 1000 prompt tokens, nothing generated: cost = flops / effective FLOP/s * normalized cost
    profile = costmodel.TaskProfile(mean_turns=1, prompt_tokens=1000, response_tokens=0)
    assert costmodel.trajectory_cost(H800, Q8B, profile) == pytest.approx(
        2.85 * 1.6675206912e13 / (989.5e12 * 0.508)
    )
    assert costmodel.trajectory_cost(H20, Q8B, profile) == pytest.approx(1.6675206912e13 / 8.88e13)


@pytest.mark.parametrize(
    "call,field",
    [
        (lambda: costmodel.accelerator("A100"), "accelerator"),
        (lambda: costmodel.model("llama"), "model"),
        (lambda: costmodel.transfer_time("carrier-pigeon", 1.0), "path"),
        (lambda: costmodel.decode_step_time(H800, Q8B, batch=1, context_tokens=0, tp=0), "tp"),
    ],
    ids=["accelerator", "model", "path", "tp"],
)
def test_bad_input_names_the_field(call: object, field: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        call()  # type: ignore[operator]
    assert info.value.field == field


def test_kv_migration_hand_computed_and_within_heddle_table_1() -> None:
    # 10k tokens of Qwen3-8B KV = 147456 * 1e4 = 1.47456e9 B over 400 Gbps at 50% = 25e9 B/s
    assert costmodel.kv_migration_time(Q8B, tokens=10_000) == pytest.approx(0.1 + 1.47456e9 / 25e9)
    assert costmodel.kv_migration_time(Q8B, tokens=0) == 0.0
    # Heddle Table 1 measures 0.12-0.35 s per migrated trajectory (8B-32B); typical contexts land there
    for shape, tokens in [(Q8B, 4_000), (Q8B, 16_000), (costmodel.QWEN3_14B, 10_000), (Q32B, 12_000)]:
        assert 0.12 <= costmodel.kv_migration_time(shape, tokens=tokens) <= 0.35
