"""The action model, profiles and CPU placement."""

from __future__ import annotations

import pytest

from treadle.errors import SpecError
from treadle.policy.tangram import cores, model, profile


def test_eq1_duration() -> None:
    e = model.Elasticity((1.0, 0.8, 0.5))
    a = model.Action("a", "cpu", {"cpu": (1, 2, 3, 4)}, 12.0, e)
    assert a.options == (1, 2, 3)  # no profile beyond 3 units
    assert [a.duration(m) for m in a.options] == pytest.approx([12.0, 7.5, 8.0])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"key": "gpu"}, "key"),
        ({"cost": {"cpu": (2, 1)}}, "cost.cpu"),
        ({"cost": {"cpu": (0,)}}, "cost.cpu"),
        ({"duration_s": -1.0}, "duration_s"),
    ],
)
def test_bad_actions_name_the_field(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {"id": "a", "key": "cpu", "cost": {"cpu": (1,)}, "duration_s": 1.0}
    with pytest.raises(SpecError) as info:
        model.Action(**(base | kwargs))  # type: ignore[arg-type]
    assert info.value.field == field


def test_elasticity_is_fitted_from_amdahl_samples() -> None:
    serial = 0.2
    samples = [(m, serial + (1 - serial) / m) for m in (1, 2, 4, 8)]
    e = profile.fit(samples, 16) or pytest.fail("no fit")
    assert e.efficiency[0] == pytest.approx(1.0)
    assert e.efficiency[7] == pytest.approx(1.0 / (serial * 8 + 1 - serial))
    assert profile.fit([(4, 1.0), (4, 1.1)], 8) is None  # one amount shows no elasticity


def test_no_speed_up_fits_a_non_scalable_curve() -> None:
    e = profile.fit([(1, 1.0), (2, 1.1), (4, 1.2)], 4) or pytest.fail("no fit")  # slower with more units
    assert [m * x for m, x in enumerate(e.efficiency, 1)] == pytest.approx([1.0] * 4)


def test_average_is_a_plain_mean_then_windowed() -> None:
    avg = profile.Average(window=2)
    for x in (1.0, 3.0):
        avg = avg.observe(x)
    assert avg.mean == pytest.approx(2.0)
    assert avg.observe(4.0).mean == pytest.approx(3.0)


def test_place_balances_cpu_and_memory() -> None:
    nodes = [cores.Node(10, 16, 100, 200), cores.Node(12, 16, 20, 200), cores.Node(1, 16, 200, 200)]
    assert cores.place(nodes, cores=2, memory_gb=10) == 0  # node 1 is memory-loaded, node 2 full
    assert cores.place(nodes, cores=2, memory_gb=150) is None


def test_pick_prefers_one_numa_domain() -> None:
    domains = [[0, 1, 2, 3, 4, 5], [8, 9, 10], [16]]
    assert cores.pick(domains, 3) == (8, 9, 10)  # the fullest domain that fits
    assert cores.pick(domains, 8) == (0, 1, 2, 3, 4, 5, 8, 9)
    with pytest.raises(SpecError):
        cores.pick(domains, 11)


def test_a_kind_whose_smallest_amount_is_two_units_fits_its_one_unit_duration() -> None:
    """GPU variants may start at TP2: T_ori comes from the fitted curve, not from a 1-unit run."""
    p = profile.KindProfile("gpu", (2, 4, 8))
    assert p.action("a").cost == {"gpu": (8,)}  # the first probe: the largest amount
    p.observe(8, 1.0)
    assert p.action("b").cost == {"gpu": (2,)}  # then the smallest
    p.observe(2, 2.5)  # Amdahl a + b/m through (2, 2.5) and (8, 1.0): a = 0.5, b = 4, T(1) = 4.5
    fitted = p.action("c")
    assert fitted.options == (2, 4, 8)
    assert fitted.duration_s == pytest.approx(4.5)
    assert fitted.duration(2) == pytest.approx(2.5) and fitted.duration(8) == pytest.approx(1.0)


def test_a_kind_profile_refuses_amounts_that_are_not_ascending() -> None:
    with pytest.raises(SpecError):
        profile.KindProfile("gpu", (4, 2))
