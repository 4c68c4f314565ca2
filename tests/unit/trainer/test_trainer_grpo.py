"""GRPO math checked by hand: advantages, the clipped surrogate, KL and its gradients."""

from __future__ import annotations

import math

import pytest
import torch

from treadle import errors
from treadle.trainer import grpo


def test_advantages_by_hand() -> None:
    # Group g: rewards 1, 0 -> mean 0.5, population std 0.5 -> +1, -1. Group h: all equal -> 0.
    adv = grpo.group_advantages([1.0, 0.0, 0.3, 0.3], ["g", "g", "h", "h"], eps=0.0)
    assert adv == [1.0, -1.0, 0.0, 0.0]


def test_advantages_three_members_and_unscaled() -> None:
    # 0, 1, 2: mean 1, std sqrt(2/3).
    rewards, groups = [0.0, 1.0, 2.0], ["x", "x", "x"]
    std = math.sqrt(2 / 3)
    assert grpo.group_advantages(rewards, groups, eps=0.0) == pytest.approx([-1 / std, 0.0, 1 / std])
    assert grpo.group_advantages(rewards, groups, scale=False) == [-1.0, 0.0, 1.0]


def test_advantages_interleaved_groups_keep_order() -> None:
    adv = grpo.group_advantages([2.0, 10.0, 0.0, 20.0], ["a", "b", "a", "b"], scale=False)
    assert adv == [1.0, -5.0, -1.0, 5.0]


def test_single_member_group_has_no_signal() -> None:
    assert grpo.group_advantages([0.7], ["solo"]) == [0.0]


@pytest.mark.parametrize(
    "rewards,groups,field",
    [([1.0], ["a", "b"], "groups"), ([float("nan")], ["a"], "rewards"), ([math.inf], ["a"], "rewards")],
)
def test_advantages_bad_input(rewards: list[float], groups: list[str], field: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        grpo.group_advantages(rewards, groups)
    assert info.value.field == field


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_on_policy_loss_is_minus_mean_advantage_and_gradient_is_advantage() -> None:
    # rho = 1 everywhere: loss = -(sum of A over tokens) / tokens; d loss / d logp = -A / tokens.
    logp = _t([[-1.0, -2.0], [-0.5, 0.0]]).requires_grad_()
    mask = _t([[1, 1], [1, 0]])
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss, stats = grpo.policy_loss(logp, logp.detach().clone(), adv, mask)
    assert loss.item() == pytest.approx(-(1 + 1 - 2) / 3)
    torch.autograd.backward(loss)
    assert logp.grad is not None
    assert logp.grad.flatten().tolist() == pytest.approx([-1 / 3, -1 / 3, 2 / 3, 0.0])
    assert stats.tokens == 3 and stats.clip_fraction == 0.0 and stats.behaviour_kl == pytest.approx(0.0)


def test_clip_binds_above_for_positive_and_below_for_negative_advantage() -> None:
    # Token 1: rho = e^0.5 ~ 1.65 > 1.2 with A = +1 -> clipped to 1.2, zero gradient.
    # Token 2: rho = e^-0.5 ~ 0.61 < 0.8 with A = -1 -> clipped to 0.8 (-0.8 * -1), zero gradient.
    # Token 3: rho = e^0.1 with A = +1 -> inside the range, gradient -rho * A / tokens.
    logp = _t([[0.5], [-0.5], [0.1]]).requires_grad_()
    behaviour = _t([[0.0], [0.0], [0.0]])
    adv = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    loss, stats = grpo.policy_loss(logp, behaviour, adv, torch.ones_like(behaviour))
    expected = (-1.2 + 0.8 - math.exp(0.1)) / 3
    assert loss.item() == pytest.approx(expected)
    torch.autograd.backward(loss)
    assert logp.grad is not None
    assert logp.grad[:, 0].tolist() == pytest.approx([0.0, 0.0, -math.exp(0.1) / 3])
    assert stats.clip_fraction == pytest.approx(2 / 3)
    assert stats.behaviour_kl == pytest.approx(-(0.5 - 0.5 + 0.1) / 3)


def test_clip_does_not_bind_on_the_side_that_lowers_the_objective() -> None:
    # rho ~ 1.65 with A = -1: min(-1.65, -1.2) = -1.65, the unclipped term keeps its gradient.
    logp = _t([[0.5]]).requires_grad_()
    loss, stats = grpo.policy_loss(logp, _t([[0.0]]), torch.tensor([-1.0], dtype=torch.float64), _t([[1]]))
    assert loss.item() == pytest.approx(math.exp(0.5))
    assert stats.clip_fraction == 0.0


def test_clip_higher_is_asymmetric() -> None:
    logp = _t([[0.25]]).requires_grad_()  # rho ~ 1.284
    cfg = grpo.LossConfig(clip_low=0.2, clip_high=0.28)
    loss, stats = grpo.policy_loss(logp, _t([[0.0]]), torch.tensor([1.0], dtype=torch.float64), _t([[1]]),
                                   config=cfg)  # fmt: skip
    assert loss.item() == pytest.approx(-1.28)
    assert stats.clip_fraction == 1.0


def test_masked_tokens_change_nothing() -> None:
    logp = _t([[-1.0, 123.0]]).requires_grad_()
    loss, stats = grpo.policy_loss(logp, _t([[-1.0, -50.0]]), torch.tensor([2.0], dtype=torch.float64),
                                   _t([[1, 0]]))  # fmt: skip
    assert loss.item() == pytest.approx(-2.0)
    torch.autograd.backward(loss)
    assert logp.grad is not None and logp.grad[0, 1].item() == 0.0
    assert stats.tokens == 1


def test_k3_kl_by_hand() -> None:
    # delta = ref - logp = -0.5: k3 = e^-0.5 + 0.5 - 1; on-policy term -A = 0 with A = 0.
    logp = _t([[0.0]]).requires_grad_()
    cfg = grpo.LossConfig(kl_coef=0.1)
    loss, stats = grpo.policy_loss(logp, logp.detach().clone(), torch.tensor([0.0], dtype=torch.float64),
                                   _t([[1]]), config=cfg, ref_logprobs=_t([[-0.5]]))  # fmt: skip
    k3 = math.exp(-0.5) + 0.5 - 1
    assert stats.kl == pytest.approx(k3)
    assert loss.item() == pytest.approx(0.1 * k3)
    torch.autograd.backward(loss)
    # d k3 / d logp = -e^delta + 1
    assert logp.grad is not None and logp.grad.item() == pytest.approx(0.1 * (1 - math.exp(-0.5)))


def test_kl_without_reference_is_refused() -> None:
    with pytest.raises(errors.SpecError) as info:
        grpo.policy_loss(_t([[0.0]]), _t([[0.0]]), torch.tensor([0.0]), _t([[1]]),
                         config=grpo.LossConfig(kl_coef=0.1))  # fmt: skip
    assert info.value.field == "ref_logprobs"


def test_shape_errors_name_the_field() -> None:
    with pytest.raises(errors.SpecError) as info:
        grpo.policy_loss(_t([[0.0, 0.0]]), _t([[0.0]]), torch.tensor([0.0]), _t([[1, 1]]))
    assert info.value.field == "behaviour_logprobs"
    with pytest.raises(errors.SpecError) as info:
        grpo.policy_loss(_t([[0.0]]), _t([[0.0]]), torch.tensor([0.0, 1.0]), _t([[1]]))
    assert info.value.field == "advantages"


@pytest.mark.parametrize("field", ["clip_low", "clip_high", "kl_coef"])
def test_loss_config_rejects_negative(field: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        grpo.LossConfig(**{field: -0.1})
    assert info.value.field == field
