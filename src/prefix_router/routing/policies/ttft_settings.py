"""The ``ttft`` policy's knobs (``routing.policies.ttft``); its algorithm is documented in ``ttft.py``.

A module of its own, as ``prefix_settings.py``: a compiled pydantic class would lose its field constraints.
"""

from __future__ import annotations

from pydantic import Field

from prefix_router.settings import Section


class TtftSettings(Section):
    """``routing.policies.ttft``: the bounded-load cap and the prior of the first-token model."""

    load_factor: float = Field(default=3.0, gt=0)  # cap: load_factor x mean in flight ...
    load_slack: int = Field(default=2, ge=0)  # ... + load_slack requests
    # seconds per token-equivalent of prefill until a worker's own rate is learned (1e-4: 10,000 tokens/s)
    prior_prefill_s_per_token: float = Field(default=1e-4, gt=0)
