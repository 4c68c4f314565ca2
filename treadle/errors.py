"""Treadle's error vocabulary, shared by every component and mapped once at each protocol edge."""

from __future__ import annotations

from collections.abc import Sequence


class TreadleError(Exception):
    """Base of every error Treadle raises on purpose."""


class SpecError(TreadleError, ValueError):
    """Bad input; ``field`` names the offending field (dotted path), ``value`` what was given.

    ``problems`` is every problem found in the same input at once (``gather``), this one first, each
    a ``SpecError`` naming its own field: ``treadle validate`` prints them all, while code that handles
    one error reads ``field``, ``value`` and the message, which are the first problem's."""

    def __init__(self, message: str, *, field: str, value: object = None) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.value = value
        self.problems: tuple[SpecError, ...] = (self,)

    @staticmethod
    def gather(found: Sequence[SpecError]) -> SpecError:
        """The first of ``found`` (not empty), carrying every problem of all of them in order."""
        first = found[0]
        first.problems = tuple(problem for error in found for problem in error.problems)
        return first


class NotFound(TreadleError, LookupError):
    """An id (trajectory, session, version...) that is not known."""


class Conflict(TreadleError):
    """The request is valid but the current state forbids it (stale version, suspended...)."""


class Unavailable(TreadleError):
    """A dependency is down or draining; retrying later may succeed."""


class Overloaded(TreadleError):
    """The request is valid but the queue it would join is full; retry after ``retry_after_s``.

    gRPC answers ``RESOURCE_EXHAUSTED``, HTTP ``429`` with a ``Retry-After`` header.
    """

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unauthenticated(TreadleError):
    """The caller did not show the job's token (gRPC ``UNAUTHENTICATED``, HTTP ``401``)."""
