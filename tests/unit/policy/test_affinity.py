"""Affinity resolution (declared and ``auto``) and the eligible-pool filter."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.policy import affinity

# Profiles shaped like RollArt Table 1's domains (turn counts from the table; token counts ours).
FROZENLAKE = affinity.TaskProfile(
    mean_turns=40, prompt_tokens=400, response_tokens=80, observation_tokens=120
)
SWE = affinity.TaskProfile(mean_turns=40, prompt_tokens=2000, response_tokens=250, observation_tokens=600)
GEM_MATH = affinity.TaskProfile(mean_turns=3, prompt_tokens=300, response_tokens=1500, observation_tokens=60)
GEM_GAME = affinity.TaskProfile(mean_turns=1, prompt_tokens=200, response_tokens=2000)


@pytest.mark.parametrize(
    "declared,profile,want",
    [
        ("prefill-heavy", None, "prefill-heavy"),  # a declaration is taken as is
        ("decode-heavy", FROZENLAKE, "decode-heavy"),  # ... even against the profile
        ("auto", None, "decode-heavy"),  # no profile yet: RollArt's default (H20)
        ("auto", FROZENLAKE, "prefill-heavy"),  # Table 1: FrozenLake prefill-heavy
        ("auto", SWE, "prefill-heavy"),  # Table 1: SWE-bench prefill-heavy
        ("auto", GEM_MATH, "decode-heavy"),  # Table 1: GEM-math decode-heavy
        ("auto", GEM_GAME, "decode-heavy"),  # Table 1: GEM-game decode-heavy
    ],
    ids=["declared-prefill", "declared-wins", "auto-no-profile", "frozenlake", "swe", "gem-math", "gem-game"],
)
def test_resolve(declared: str, profile: affinity.TaskProfile | None, want: str) -> None:
    assert affinity.resolve(declared, profile) == want


def test_auto_flips_when_the_prefix_cache_serves_the_history() -> None:
    # Many turns are prefill-heavy only because the history is re-prefilled; with a perfect prefix
    # cache FrozenLake's work is mostly decode at long context, which H20 does cheaper.
    cached = affinity.TaskProfile(
        mean_turns=40, prompt_tokens=400, response_tokens=80, observation_tokens=120, prefix_reuse=1.0
    )
    assert affinity.resolve("auto", cached) == "decode-heavy"


@pytest.mark.parametrize(
    "declared,profile,field",
    [
        ("H800", None, "affinity"),
        (
            "auto",
            affinity.TaskProfile(mean_turns=-1, prompt_tokens=1, response_tokens=1),
            "profile.mean_turns",
        ),
        (
            "auto",
            affinity.TaskProfile(mean_turns=2, prompt_tokens=1, response_tokens=1, prefix_reuse=1.5),
            "profile.prefix_reuse",
        ),
    ],
    ids=["unknown-declaration", "negative-turns", "reuse-above-one"],
)
def test_resolve_rejects_bad_input(declared: str, profile: affinity.TaskProfile | None, field: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        affinity.resolve(declared, profile)
    assert info.value.field == field


POOLS = {"h800": "prefill-heavy", "h20": "decode-heavy", "spare": "any"}


@pytest.mark.parametrize(
    "work,pools,want",
    [
        ("prefill-heavy", POOLS, ["h800", "spare"]),  # matching plus "any"
        ("decode-heavy", POOLS, ["h20", "spare"]),
        ("decode-heavy", {"b": "decode-heavy", "a": "decode-heavy"}, ["a", "b"]),  # sorted
        ("prefill-heavy", {"h20": "decode-heavy", "h20b": "decode-heavy"}, ["h20", "h20b"]),  # fallback: all
        ("prefill-heavy", {"cpu": "any"}, ["cpu"]),  # "any" alone counts as a match
        ("decode-heavy", {}, []),  # nothing to choose from
    ],
    ids=["prefill", "decode", "sorted", "fallback-all", "any-only", "empty"],
)
def test_eligible_pools(work: str, pools: dict[str, str], want: list[str]) -> None:
    assert affinity.eligible_pools(work, pools) == want


@pytest.mark.parametrize(
    "work,pools,field",
    [("auto", POOLS, "work"), ("prefill-heavy", {"h800": "fast"}, "pools.h800")],
    ids=["unresolved-work", "bad-pool-preference"],
)
def test_eligible_pools_rejects_bad_input(work: str, pools: dict[str, str], field: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        affinity.eligible_pools(work, pools)
    assert info.value.field == field
