"""Token units of text keys: what a model's key characters are worth in tokens, learned from its engines.

A key of text blocks (the default key without a tokenizer) counts *nominal* tokens: UTF-8 bytes /
``routing.keys.chars_per_token`` (a block of ``block_chars`` is ``block_tokens``). Real tokenizers differ
(English prose is about 5 bytes per token for SmolLM2; code, JSON and other scripts fewer), so the router
learns, per model, the *scale*: engine tokens per nominal token.

Algorithm. A sample is an answered request's ``usage.prompt_tokens`` (the engine's count) over the nominal
tokens of its key, taken when the key is text and at least ``min_sample_tokens`` nominal tokens long (a chat
template adds a few tokens per message that the key does not count; on a long prompt they are a small part),
clamped to [1/4, 4]. Per model: the moving average of the samples (weight ``alpha``; a plain average over
the first 1/alpha samples) and their moving variance. The scale in use is ``average - margin x deviation``
(a lower bound: one prompt's text is denser or sparser than the model's average, and over-predicting a
match is the costly error), from ``warmup`` samples on.

Fallback: before ``warmup`` samples, for models never reported, with ``learn`` off, and for token-id keys
(a tokenizer, exact mode, completions given as ids: counted exactly), the scale is 1 (the configured
``chars_per_token``). Engines of one model share its tokenizer and chat template, so the table is per model,
not per worker: every worker's reports teach it, and it applies before a worker is chosen.

Where it applies (``router.py``): the prediction, the prompt length of the load tracker and the prefill
drain, the ``prefix`` policy's cost (``Context.token_scale``), and the index's conversion of a worker's
capacity from tokens into blocks (each worker at the scale of the model it last reported for). Each
router replica learns its own (``warmup`` reports suffice).

Knobs (``routing.units``, ``UnitSettings``): ``learn`` (true), ``alpha`` (1/32), ``min_sample_tokens`` (512),
``warmup`` (8), ``margin`` (1.0), ``max_models`` (1,024; the least recently reported model gives way).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from prefix_router.routing.settings import UnitSettings

CLAMP = 4.0  # a sample is clamped to [1 / CLAMP, CLAMP] x the nominal value
MAX_REPORT_TOKENS = 1 << 31  # no prompt is this long: a larger count is not a sample


@dataclass(slots=True)
class ModelUnits:
    """One model's learned scale (engine tokens per nominal token)."""

    samples: int = 0
    mean: float = 1.0
    variance: float = 0.0
    clamped: int = 0  # samples outside [1/4, 4], clamped before use

    def deviation(self) -> float:
        return math.sqrt(self.variance)


class TokenUnits:
    """Per model, the learned scale of text keys' nominal tokens (see the module docstring)."""

    def __init__(self, cfg: UnitSettings, chars_per_token: float) -> None:
        self.cfg = cfg
        self.chars_per_token = chars_per_token
        self._models: OrderedDict[str, ModelUnits] = OrderedDict()
        self.scales: dict[str, float] = {}  # model -> scale in use (read once per request)

    def scale(self, model: str | None) -> float:
        """Engine tokens per nominal token of a key of ``model`` (None: a token-id key, 1)."""
        return self.scales.get(model, 1.0) if model is not None else 1.0

    def observe(self, model: str, nominal: int, reported: int | None) -> bool:
        """Learn from a response reporting ``reported`` prompt tokens for a text key of ``nominal`` tokens;
        returns whether it was a sample."""
        cfg = self.cfg
        if not cfg.learn or reported is None or nominal < cfg.min_sample_tokens:
            return False
        if not 0 < reported <= MAX_REPORT_TOKENS:
            return False
        units = self._units(model)
        sample = reported / nominal
        bounded = min(max(sample, 1.0 / CLAMP), CLAMP)
        units.clamped += bounded != sample
        units.samples += 1
        if units.samples == 1:
            units.mean, units.variance = bounded, 0.0
        else:
            alpha = max(cfg.alpha, 1.0 / units.samples)
            delta = bounded - units.mean
            units.mean += alpha * delta
            units.variance = (1.0 - alpha) * (units.variance + alpha * delta * delta)
        if units.samples >= cfg.warmup:
            self.scales[model] = max(1.0 / CLAMP, units.mean - cfg.margin * units.deviation())
        return True

    def _units(self, model: str) -> ModelUnits:
        units = self._models.get(model)
        if units is not None:
            self._models.move_to_end(model)
            return units
        units = self._models[model] = ModelUnits()
        while len(self._models) > self.cfg.max_models:
            old, _ = self._models.popitem(last=False)
            self.scales.pop(old, None)
        return units

    def __len__(self) -> int:
        return len(self._models)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per model: reports learned from, the learned characters per token (average and in use), the
        scale in use (engine tokens per nominal token) and the samples clamped."""
        cpt = self.chars_per_token
        return {
            model: {
                "samples": u.samples,
                "chars_per_token": cpt / u.mean,
                "chars_per_token_used": cpt / self.scale(model),
                "scale": self.scale(model),
                "deviation": u.deviation(),
                "clamped": u.clamped,
            }
            for model, u in self._models.items()
        }
