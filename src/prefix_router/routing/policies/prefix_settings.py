"""The ``prefix`` policy's knobs (``routing.policies.prefix``); its algorithm is documented in ``prefix.py``.

A module of its own: ``prefix.py`` is compiled by mypyc in the release build, and a compiled pydantic class
loses its field constraints; this one stays Python in both builds.
"""

from __future__ import annotations

from pydantic import Field

from prefix_router.settings import Section


class PrefixSettings(Section):
    """``routing.policies.prefix``: the bounded-load cap, the load penalties and the weights of the future."""

    load_factor: float = Field(default=1.25, gt=0)  # cap: load_factor x mean in flight ...
    load_slack: int = Field(default=2, ge=0)  # ... + load_slack requests
    queue_penalty_tokens: int = Field(default=512, ge=0)  # per request waiting in the engine's queue
    in_flight_penalty_tokens: int = Field(default=512, ge=0)  # per request there before its first token
    decoding_penalty_tokens: int = Field(default=512, ge=0)  # per request there past its first token
    recompute_weight: float = Field(default=1.0, ge=0)  # a full cache: what an evicted token costs later
    saturation_weight: float = Field(default=1.0, ge=0)  # x the requests a token of prefill delays
    hit_cap_factor: float = Field(default=2.0, ge=1)  # a cheap hit may go up to this x the cap; 1: never
    hit_cap_share: float = Field(default=0.9, gt=0, le=1)  # cheap: this share of the prompt held, and
    # no more prefill work left than the fleet's mean request
