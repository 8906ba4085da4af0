"""One row per policy: ``PolicySpec`` (its name, knob group, factory, session rule and summary).

Adding a policy = one module (the algorithm, with its knob group as a frozen ``Section``) + one
``PolicySpec`` row in ``routing/policies/__init__.py``; its knobs then appear under
``routing.policies.<name>`` in the configuration, with their constraints and defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from prefix_router.routing.types import Policy
from prefix_router.settings import Section

K = TypeVar("K", bound=Section)


class NoSettings(Section):
    """The knob group of a policy without knobs (``routing.policies.<name>: {}``)."""


@dataclass(frozen=True, slots=True)
class PolicySpec(Generic[K]):
    """A routing policy as the router and the configuration see it.

    ``knobs``: its settings class (``routing.policies.<name>``); ``factory`` builds a fresh policy from
    them; ``honours_sessions``: whether the router's session affinity applies under it (the baselines do
    not, so that they stay honest baselines); ``summary``: one line for ``--help`` and the docs.
    """

    name: str
    knobs: type[K]
    factory: Callable[[K], Policy]
    honours_sessions: bool
    summary: str

    def build(self, knobs: Section | None = None) -> Policy:
        """A fresh policy with ``knobs`` (its own group's defaults when None)."""
        if knobs is None:
            return self.factory(self.knobs())
        if not isinstance(knobs, self.knobs):
            raise TypeError(f"policy {self.name}: expected {self.knobs.__name__}, got {type(knobs).__name__}")
        return self.factory(knobs)


def knobless(cls: Callable[[], Policy]) -> Callable[[NoSettings], Policy]:
    """The factory of a policy class without knobs."""

    def build(_: NoSettings) -> Policy:
        return cls()

    return build


AnySpec = PolicySpec[Any]
