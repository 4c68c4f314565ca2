"""Hardware affinity: which kind of inference pool a task's turns should run on (RollArt R1, §5.1).

Called by the placement service (``treadle.services.placement``) and by the simulator before
``treadle.policy.placement.choose_worker``: ``resolve`` turns a task's declared affinity into
``"prefill-heavy"`` or ``"decode-heavy"``; ``eligible_pools`` turns that into the pools to choose from.

RollArt declares affinity per task domain by hand ("FrozenLake": H800, "default": H20) and leaves an
online profiler as future work (§9). ``auto`` is that profiler's decision rule, ours: price one
trajectory of the measured ``TaskProfile`` on each accelerator class with the roofline cost model
(``costmodel.trajectory_cost``: GPU-seconds times normalized cost, Table 2) and pick the class that
does it cheaper -- H800 (compute-optimized) means prefill-heavy, H20 (bandwidth-optimized) means
decode-heavy. With no profile yet, ``auto`` is decode-heavy: RollArt's default for generation
(``ActorGenCls`` defaults to bandwidth-optimized GPUs and Listing 1's ``"default": "H20"``).
"""

from __future__ import annotations

from collections.abc import Mapping

from treadle import errors
from treadle.policy import costmodel

PREFILL_HEAVY = "prefill-heavy"
DECODE_HEAVY = "decode-heavy"
ANY = "any"
AUTO = "auto"
WORK_KINDS = (PREFILL_HEAVY, DECODE_HEAVY)
DECLARATIONS = (PREFILL_HEAVY, DECODE_HEAVY, AUTO)
POOL_PREFERENCES = (PREFILL_HEAVY, DECODE_HEAVY, ANY)

TaskProfile = costmodel.TaskProfile
"""Re-exported so callers of ``resolve`` need not import the cost model."""


def resolve(
    declared: str,
    profile: costmodel.TaskProfile | None,
    *,
    shape: costmodel.ModelShape = costmodel.QWEN3_8B,
    batch_per_gpu: int = costmodel.REFERENCE_BATCH_PER_GPU,
) -> str:
    """``"prefill-heavy"`` or ``"decode-heavy"`` for a task declared ``declared``.

    ``auto`` with a profile compares ``trajectory_cost`` on H800 and H20 for ``shape`` (ties go to
    decode-heavy, the default); without a profile it is decode-heavy (module docstring).
    """
    if declared in WORK_KINDS:
        return declared
    if declared != AUTO:
        raise errors.SpecError(
            f"must be one of {list(DECLARATIONS)}, got {declared!r}", field="affinity", value=declared
        )
    if profile is None:
        return DECODE_HEAVY
    _check_profile(profile)
    on_h800 = costmodel.trajectory_cost(costmodel.H800, shape, profile, batch_per_gpu=batch_per_gpu)
    on_h20 = costmodel.trajectory_cost(costmodel.H20, shape, profile, batch_per_gpu=batch_per_gpu)
    return PREFILL_HEAVY if on_h800 < on_h20 else DECODE_HEAVY


def _check_profile(profile: costmodel.TaskProfile) -> None:
    for name in ("mean_turns", "prompt_tokens", "response_tokens", "observation_tokens"):
        value = getattr(profile, name)
        if value < 0:
            raise errors.SpecError("must be >= 0", field=f"profile.{name}", value=value)
    if not 0.0 <= profile.prefix_reuse <= 1.0:
        raise errors.SpecError(
            "must be within [0, 1]", field="profile.prefix_reuse", value=profile.prefix_reuse
        )


def eligible_pools(work: str, pools: Mapping[str, str]) -> list[str]:
    """Pools (sorted) that may run ``work``: those preferring it plus the ``"any"`` pools.

    ``pools`` maps pool name to its preferred work (``"prefill-heavy"``, ``"decode-heavy"`` or
    ``"any"``). When no pool matches, every pool is returned: RollArt falls back to "compatible
    default resources rather than stalling" (§5.1), and a job on one GPU class must still run.
    """
    if work not in WORK_KINDS:
        raise errors.SpecError(f"must be one of {list(WORK_KINDS)}, got {work!r}", field="work", value=work)
    for name, preference in pools.items():
        if preference not in POOL_PREFERENCES:
            raise errors.SpecError(
                f"must be one of {list(POOL_PREFERENCES)}, got {preference!r}",
                field=f"pools.{name}",
                value=preference,
            )
    matching = sorted(name for name, preference in pools.items() if preference in (work, ANY))
    return matching or sorted(pools)
