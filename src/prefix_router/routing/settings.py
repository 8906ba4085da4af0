"""Settings of the routing core: the ``routing:`` section, frozen, typed, constraints on the fields.

```yaml
routing:
  policy: prefix              # one of routing.policies.POLICY_NAMES
  keys: {block_chars: 64, chars_per_token: 4.0, block_tokens: 16, ...}      # the routing key
  index: {worker_capacity_tokens: 1000000, max_total_blocks: 2000000, ...}  # prefix index bounds
  trackers: {max_tracked_requests: 100000, engine_load_stale_s: 10.0, attention_tokens: 32768}
  sessions: {affinity: true, max_sessions: 100000, load_factor: 1.25, load_slack: 2}
  feedback: {tolerance: 0.5, page_tokens: 16, slack_pages: 2, capacity_step: 0.1}  # engine reports
  units: {learn: true, alpha: 0.03125, min_sample_tokens: 512, warmup: 8, margin: 1.0}  # text keys' tokens
  precise: {block_tokens: 16, speculative_ttl_s: 2.0, silence_s: 10.0, ...}  # workers with kv_events
  policies:                   # one knob group per policy, declared by the policy's own module
    prefix: {load_factor: 1.25, load_slack: 2, queue_penalty_tokens: 512, in_flight_penalty_tokens: 512}
    consistent_hash: {load_factor: 1.25, load_slack: 0, replicas: 64, max_rings: 32}
```

The groups are built once, at start-up; the routing core keeps references to them (or copies of their
values), so reading a knob per request costs one attribute access.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, ModelWrapValidatorHandler, create_model, field_validator, model_validator

from prefix_router.routing.policies import DEFAULT_POLICY, POLICIES, POLICY_NAMES
from prefix_router.routing.precise import PreciseSettings
from prefix_router.settings import Section


class KeySettings(Section):
    """``routing.keys``: how a request body becomes a routing key (``routing/keys.py``). Tokens are
    estimated as characters / ``chars_per_token`` without a tokenizer.

    Every block is worth ``block_tokens`` tokens whatever the mode (the index, the predictions and the
    engine feedback count in that unit), so a block of text must be ``block_tokens`` tokens of text:
    ``block_chars == round(block_tokens x chars_per_token)``. Set one of the two and the other follows;
    set both inconsistently and the configuration is refused."""

    block_chars: int = Field(default=64, gt=0)  # UTF-8 bytes per block of text (block_tokens of text)
    chars_per_token: float = Field(default=4.0, gt=0)
    block_tokens: int = Field(default=16, gt=0)  # tokens per block, in every mode (token ids, or text)
    max_prefix_chars: int | None = Field(default=1_048_576, gt=0)  # examined prefix (1 MiB, ~256 K tokens)
    hash_prefix_chars: int = Field(default=512, gt=0)  # the prefix that ``hash_key`` hashes
    # the tenant (client bearer token digest) seeds the namespace; None: the composition root decides
    # (``serve``: on with more than one client key)
    isolate_tenants: bool | None = None
    tokenizer_path: str | None = None  # a local tokenizer.json: blocks of token ids
    image_tokens: int = Field(
        default=576, gt=0
    )  # an image part's value (engines expand images to many tokens)
    # exact mode: model name -> local model directory (tokenizer.json + tokenizer_config.json)
    exact_models: dict[str, str] = Field(default_factory=dict, max_length=1024)
    tool_choice_none_drops_tools: bool = False  # exact mode: vLLM's --exclude-tools-when-tool-choice-none
    # default mode: models (shell patterns, case-insensitive) whose chat template writes something for
    # tools before the system text (Llama 3.x: "Environment: ipython"), so that a request with tools and
    # one without share nothing; other templates (ChatML, Qwen, SmolLM2, ...) keep the system prompt first
    # either way, and so does their key
    tools_before_system: list[str] = Field(
        default_factory=lambda: ["*llama-3*", "*llama3*", "*llama_3*"], max_length=256
    )

    @field_validator("exact_models")
    @classmethod
    def _model_dirs(cls, value: dict[str, str]) -> dict[str, str]:
        for model, directory in value.items():
            for name in ("tokenizer.json", "tokenizer_config.json"):
                if not (Path(directory) / name).is_file():
                    raise ValueError(f"{model}: no {name} in {directory!r}")
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _one_token_value_per_block(cls, data: Any, handler: ModelWrapValidatorHandler[KeySettings]) -> Any:
        keys = handler(data)
        chars = round(keys.block_tokens * keys.chars_per_token)
        if keys.block_chars == chars:
            return keys
        given = keys.model_fields_set
        if "block_chars" in given and "block_tokens" not in given:
            derived = max(1, round(keys.block_chars / keys.chars_per_token))
            if round(derived * keys.chars_per_token) == keys.block_chars:
                return handler({**keys.model_dump(include=given), "block_tokens": derived})
            raise ValueError(
                f"block_chars {keys.block_chars} is not a whole number of tokens at chars_per_token "
                f"{keys.chars_per_token:g} (block_chars = round(block_tokens x chars_per_token): try "
                f"{round(derived * keys.chars_per_token)}, or set block_tokens)"
            )
        if "block_chars" not in given:
            return handler({**keys.model_dump(include=given), "block_chars": chars})
        raise ValueError(
            f"block_chars {keys.block_chars} != round(block_tokens {keys.block_tokens} x chars_per_token "
            f"{keys.chars_per_token:g}) = {chars}: every block is worth block_tokens tokens "
            "(set one of the two)"
        )


class IndexSettings(Section):
    """``routing.index``: bounds of the prefix index (``routing/index.py``)."""

    worker_capacity_tokens: int = Field(default=1_000_000, gt=0)  # until the engine's size is learned
    max_total_blocks: int = Field(default=2_000_000, gt=0)  # (worker, block) entries in all
    ttl_s: float = Field(default=3600.0, gt=0)
    max_prefix_blocks: int | None = Field(default=None, gt=0)  # blocks matched and indexed per request


class TrackerSettings(Section):
    """``routing.trackers``: the per-request tables of the load tracker and of the predictions."""

    max_tracked_requests: int = Field(default=100_000, gt=0)
    engine_load_stale_s: float = Field(default=10.0, gt=0)  # older scraped engine load is ignored
    # prefill work per token grows with its context: 1 + context / attention_tokens (about 6 x the model's
    # hidden size: 24,576 for Llama 3.1 8B, 49,152 for 70B); the unit of the backlog estimate (backlog.py)
    attention_tokens: int = Field(default=32_768, gt=0)


class SessionSettings(Section):
    """``routing.sessions``: session affinity (under the policies whose row honours sessions)."""

    affinity: bool = True
    max_sessions: int = Field(default=100_000, gt=0)
    # a session stays on its worker while it is under load_factor x mean in flight + load_slack
    load_factor: float = Field(default=1.25, gt=0)
    load_slack: int = Field(default=2, ge=0)


class FeedbackSettings(Section):
    """``routing.feedback``: what an engine's report of cached prompt tokens may correct (``feedback.py``).

    A report short of the prediction by more than ``slack_pages`` pages of ``page_tokens`` and below
    ``tolerance`` x the prediction is a miss (unless the request raced its prefix's first prefill): the
    worker's learned capacity shrinks by ``capacity_step`` of it, not below ``min_capacity_tokens``. A
    report over the prediction by more than the slack while the index is full grows it back by as much,
    up to the known (configured or scraped) capacity. A short report of a request whose prefix was, at
    its first token, older than ``queued_turnover`` x the worker's index turnover is ``queued`` (evicted
    while it waited in the engine's queue) and changes nothing; None: never. No report ever forgets a
    prefix."""

    tolerance: float = Field(default=0.5, ge=0, le=1)
    page_tokens: int = Field(default=16, gt=0)  # the engine's KV page (vLLM's default block size)
    slack_pages: int = Field(default=2, ge=0)  # differences up to this many pages are agreement
    capacity_step: float = Field(default=0.1, ge=0, lt=1)  # 0: never learn the capacity
    min_capacity_tokens: int = Field(default=4096, gt=0)
    queued_turnover: float | None = Field(default=1.0, gt=0)  # None: a queued request's report is a miss


class UnitSettings(Section):
    """``routing.units``: the tokens a text key's characters are worth, learned per model from the engines'
    ``usage.prompt_tokens`` (``routing/units.py``). A report counts when the request's key is text and at
    least ``min_sample_tokens`` nominal tokens (characters / ``keys.chars_per_token``) long; the value used
    is the moving average (weight ``alpha``) less ``margin`` moving deviations, from ``warmup`` reports on.
    With ``by_content``, a key's bytes are valued by class (word, punctuation, whitespace) by a moving
    least squares per model, less ``margin`` relative residual deviations (``min_spread``: the ridge).
    """

    learn: bool = True  # false: text keys are worth characters / keys.chars_per_token tokens, always
    alpha: float = Field(default=1 / 32, gt=0, le=1)  # weight of one report in the moving average
    min_sample_tokens: int = Field(default=512, gt=0)  # shorter prompts: template tokens weigh too much
    warmup: int = Field(default=8, gt=0)  # reports of a model before its learned value is used
    margin: float = Field(default=1.0, ge=0)  # deviations below the average (over-predicting costs more)
    max_models: int = Field(default=1024, gt=0)  # models learned at once (least recently reported dropped)
    by_content: bool = True  # value a key's bytes by class (word, punctuation, whitespace), learned per model
    # byte classes whose share of a prompt varies less than this between reports keep the common value
    min_spread: float = Field(default=0.01, gt=0, le=1)


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
    feedback: FeedbackSettings = Field(default_factory=FeedbackSettings)
    units: UnitSettings = Field(default_factory=UnitSettings)
    precise: PreciseSettings = Field(default_factory=PreciseSettings)
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
