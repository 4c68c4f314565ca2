"""Where ``Overloaded`` used to live; it is ``treadle.errors.Overloaded`` now.

Kept only as an alias until ``treadle.services.scheduler.service`` (another owner) imports it from
``treadle.errors``; delete this module then.
"""

from __future__ import annotations

from treadle import errors

Overloaded = errors.Overloaded
