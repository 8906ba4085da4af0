"""Settings of the routing core: the ``routing:`` section, frozen, typed, constraints on the fields.

```yaml
routing:
  policy: prefix              # one of routing.policies.POLICY_NAMES
  keys:                       # the routing key (routing/keys.py)
    mode: characters          # what the key reads: characters | tokenizer | template | events
    tokenizer: null           # mode tokenizer: a local tokenizer.json
    templates: {}             # mode template (events: optional): model -> local model directory
    block_tokens: 16          # tokens per block, in every mode
    chars_per_token: 4.0      # a text token's bytes until learned (a text block: 64 bytes)
    max_prefix_chars: 1048576 # the key's examined prefix
  index: {worker_capacity_tokens: 1000000, max_total_blocks: 2000000, ttl_s: 3600, max_prefix_blocks: null}
  trackers: {max_tracked_requests: 100000, attention_tokens: 32768}
  sessions: {header: x-session-id, affinity: true, max_sessions: 100000, load_factor: 1.25, load_slack: 2}
  units: {learn: true}        # text keys' tokens learned from the engines' reports
  events: {block_tokens: 16, render: true}  # mode events: the engines' KV cache events
  policies:                   # one knob group per policy, declared by the policy's own module
    prefix: {load_factor: 1.25, load_slack: 2, queue_penalty_tokens: 512, in_flight_penalty_tokens: 512}
    consistent_hash: {load_factor: 1.25, load_slack: 0, replicas: 64}
```

A knob stays where an operator has a real choice; what the algorithms use besides is a constant beside the
algorithm (``routing/feedback.py``, ``routing/units.py``, ``routing/precise.py``, ``routing/load.py``,
the policies' modules), and a removed or renamed key is refused with its new name
(``prefix_router.settings.RETIRED_KEYS``).

The groups are built once, at start-up; the routing core keeps references to them (or copies of their
values), so reading a knob per request costs one attribute access.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model, field_validator, model_validator

from prefix_router.protocol import SESSION_HEADER
from prefix_router.routing.policies import DEFAULT_POLICY, POLICIES, POLICY_NAMES
from prefix_router.routing.precise import PreciseSettings
from prefix_router.settings import Section

KeyMode = Literal["characters", "tokenizer", "template", "events"]


class KeySettings(Section):
    """``routing.keys``: how a request body becomes a routing key (``routing/keys.py``), named by what it
    reads (``mode``):

    - ``characters``: the request's text, in blocks of ``block_tokens x chars_per_token`` UTF-8 bytes;
    - ``tokenizer``: the text tokenized by ``tokenizer`` (a local ``tokenizer.json``), in blocks of
      ``block_tokens`` ids;
    - ``template``: for the models in ``templates``, the model's own chat template and tokenizer (the token
      ids the engine computes); other models' requests read characters;
    - ``events``: the engines' KV cache events (workers with ``kv_events``; ``routing.events``), a
      request's token ids from ``templates`` or rendered by its engine; otherwise as ``characters``.

    Every block is worth ``block_tokens`` tokens whatever the mode (the index, the predictions and the
    engine feedback count in that unit), so a block of text is ``block_chars = round(block_tokens x
    chars_per_token)`` bytes. ``isolate_tenants`` is not a configuration key: the composition root copies
    ``tenants.isolate`` into it."""

    mode: KeyMode = "characters"
    tokenizer: str | None = None  # mode tokenizer: a local tokenizer.json
    # mode template (required) and events (optional): model name -> local model directory
    # (tokenizer.json + tokenizer_config.json)
    templates: dict[str, str] = Field(default_factory=dict, max_length=1024)
    block_tokens: int = Field(default=16, gt=0)  # tokens per block, in every mode (token ids, or text)
    chars_per_token: float = Field(default=4.0, gt=0)  # a text token's bytes, until learned (units)
    max_prefix_chars: int | None = Field(default=1_048_576, gt=0)  # examined prefix (1 MiB, ~256 K tokens)
    image_tokens: int = Field(
        default=576, gt=0
    )  # an image part's value (engines expand images to many tokens)
    tool_choice_none_drops_tools: bool = False  # templates: vLLM's --exclude-tools-when-tool-choice-none
    # characters: models (shell patterns, case-insensitive) whose chat template writes something for
    # tools before the system text (Llama 3.x: "Environment: ipython"), so that a request with tools and
    # one without share nothing; other templates (ChatML, Qwen, SmolLM2, ...) keep the system prompt first
    # either way, and so does their key
    tools_before_system: list[str] = Field(
        default_factory=lambda: ["*llama-3*", "*llama3*", "*llama_3*"], max_length=256
    )
    # the tenant (client bearer token digest) seeds the namespace: ``tenants.isolate``, set by the
    # composition root (not read from the configuration, not printed)
    isolate_tenants: bool = Field(default=False, exclude=True)

    @property
    def block_chars(self) -> int:
        """UTF-8 bytes per block of text: ``round(block_tokens x chars_per_token)``."""
        return round(self.block_tokens * self.chars_per_token)

    @field_validator("templates")
    @classmethod
    def _model_dirs(cls, value: dict[str, str]) -> dict[str, str]:
        for model, directory in value.items():
            for name in ("tokenizer.json", "tokenizer_config.json"):
                if not (Path(directory) / name).is_file():
                    raise ValueError(f"{model}: no {name} in {directory!r}")
        return value

    @model_validator(mode="after")
    def _mode_inputs(self) -> KeySettings:
        problem = mode_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self


def mode_problem(keys: KeySettings) -> str | None:
    """What is wrong with the key mode and its inputs, in one line; None when they agree."""
    if keys.block_chars < 1:
        return "block_tokens x chars_per_token is under one byte: a text block would be empty"
    if keys.mode == "tokenizer" and keys.tokenizer is None:
        return "mode tokenizer needs routing.keys.tokenizer (a local tokenizer.json)"
    if keys.tokenizer is not None and keys.mode != "tokenizer":
        return f"tokenizer: only with mode tokenizer (mode is {keys.mode})"
    if keys.mode == "template" and not keys.templates:
        return "mode template needs routing.keys.templates (model -> local model directory)"
    if keys.templates and keys.mode not in ("template", "events"):
        return f"templates: only with mode template or events (mode is {keys.mode})"
    return None


class IndexSettings(Section):
    """``routing.index``: bounds of the prefix index (``routing/index.py``)."""

    worker_capacity_tokens: int = Field(default=1_000_000, gt=0)  # until the engine's size is learned
    max_total_blocks: int = Field(default=2_000_000, gt=0)  # (worker, block) entries in all
    ttl_s: float = Field(default=3600.0, gt=0)
    max_prefix_blocks: int | None = Field(default=None, gt=0)  # blocks matched and indexed per request


class TrackerSettings(Section):
    """``routing.trackers``: the per-request tables of the load tracker and of the predictions."""

    max_tracked_requests: int = Field(default=100_000, gt=0)
    # prefill work per token grows with its context: 1 + context / attention_tokens (about 6 x the model's
    # hidden size: 24,576 for Llama 3.1 8B, 49,152 for 70B); the unit of the backlog estimate (backlog.py)
    attention_tokens: int = Field(default=32_768, gt=0)


class SessionSettings(Section):
    """``routing.sessions``: session affinity (under the policies whose row honours sessions), and the
    request header that names a session (read by the proxy)."""

    header: str = Field(default=SESSION_HEADER, min_length=1, max_length=128)
    affinity: bool = True
    max_sessions: int = Field(default=100_000, gt=0)
    # a session stays on its worker while it is under load_factor x mean in flight + load_slack; a prefix
    # that the engines' events hold nowhere goes back to its last home under the same cap (Router._home)
    load_factor: float = Field(default=1.25, gt=0)
    load_slack: int = Field(default=2, ge=0)


class UnitSettings(Section):
    """``routing.units``: whether the tokens a text key's characters are worth are learned per model from
    the engines' ``usage.prompt_tokens`` (``routing/units.py``; its constants: ``UnitTuning``)."""

    learn: bool = True  # false: text keys are worth characters / keys.chars_per_token tokens, always


def _policy_groups() -> type[Section]:
    """``routing.policies``: one field per ``PolicySpec`` row, typed by the row's knob group."""
    fields: dict[str, Any] = {
        spec.name: (spec.knobs, Field(default_factory=spec.knobs, description=spec.summary))
        for spec in POLICIES
    }
    return create_model("PolicyGroups", __base__=Section, __module__=__name__, **fields)


if TYPE_CHECKING:
    PolicyGroups = Section  # built from the rows at import time; read through ``RoutingSettings.knobs``
else:
    PolicyGroups = _policy_groups()


class RoutingSettings(Section):
    """Every knob of the routing core, in groups (see the module docstring for the YAML shape)."""

    policy: str = DEFAULT_POLICY
    keys: KeySettings = Field(default_factory=KeySettings)
    index: IndexSettings = Field(default_factory=IndexSettings)
    trackers: TrackerSettings = Field(default_factory=TrackerSettings)
    sessions: SessionSettings = Field(default_factory=SessionSettings)
    units: UnitSettings = Field(default_factory=UnitSettings)
    events: PreciseSettings = Field(default_factory=PreciseSettings)
    policies: PolicyGroups = Field(default_factory=PolicyGroups)

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in POLICY_NAMES:
            raise ValueError(f"unknown policy {value!r} (one of {', '.join(POLICY_NAMES)})")
        return value

    def knobs(self, policy: str) -> Section:
        """The knob group of ``policy`` (``routing.policies.<policy>``)."""
        group: Section = getattr(self.policies, policy)
        return group
