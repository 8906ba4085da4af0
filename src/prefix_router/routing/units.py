"""Token units of text keys: what a model's key characters are worth in tokens, learned from its engines.

A text key counts *nominal* tokens (UTF-8 bytes / ``routing.keys.chars_per_token``). ``TokenUnits`` learns,
per model, from the engines' ``usage.prompt_tokens``:

1. the *scale*, engine tokens per nominal token: the moving average of samples (keys of at least
   ``min_sample_tokens``, clamped to [1/4, 4]) less ``margin`` moving deviations, in use from ``warmup``
   samples on; it values a worker's blocks in the index and keys that carry no byte counts;
2. the *content value* (``by_content``): tokens per byte by class (word, punctuation and whitespace
   bytes; image placeholders are worth ``keys.image_tokens``), fitted per model by moving least squares,
   ridge-pulled towards one value for all classes (``min_spread``) and lowered by ``margin`` relative
   residual deviations; each span is clamped to [1/4, 4] x nominal. A match of k blocks is valued by the
   classes of the request's own first k blocks (``count_marks``), the prompt by the whole key's.

Warm-up: before ``warmup`` samples the scale is the lowest sample so far, never above 1, so that a model
denser than the configured ``chars_per_token`` is not over-predicted until its eighth report (SmolLM2's
prose, about 5 bytes per token: a 4 KB system prompt was predicted at 896 cached tokens where vLLM held
640); the content value waits for the warm-up. Before the model's first report (``first``), a cached
match is valued at ``first_chars_per_token`` (8) bytes per token, not the configured 4: the first
repeat on llama.cpp with SmolLM2 was predicted at 1,104 tokens where the engine reused 739 (a streamed
answer without usage teaches nothing). Fallback: the scale is 1 (the configured ``chars_per_token``) for
a model never reported and with ``learn`` off; token-id keys are counted exactly; keys without counts use
the scale. The table is per model (its engines share a tokenizer and chat template) and per router
replica.

Knob (``routing.units``, ``UnitSettings``): ``learn`` (true). Constants (``UnitTuning``): ``alpha`` (1/32),
``min_sample_tokens`` (512), ``warmup`` (8), ``margin`` (1.0), ``max_models`` (1,024; the least recently
reported model gives way), ``by_content`` (true), ``min_spread`` (0.01), ``first_chars_per_token`` (8).
Why and what it measures:
docs/routing.md, "Token units".
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from prefix_router.routing.canonical import MEDIA
from prefix_router.routing.settings import UnitSettings

# A model's cached tokens before its first report are valued at this many bytes per token (at most the
# configured ``chars_per_token``'s value): above any common tokenizer's prose (Llama 3 about 4.5, Gemma
# about 5, SmolLM2 about 6), so that the first prediction is no more than the engine will reuse.
FIRST_CHARS_PER_TOKEN = 8.0
CLAMP = 4.0  # a sample is clamped to [1 / CLAMP, CLAMP] x the nominal value
MAX_REPORT_TOKENS = 1 << 31  # no prompt is this long: a larger count is not a sample

# byte classes of a text key (UTF-8): deleting the word bytes leaves punctuation, whitespace and images
_WORD = bytes([*range(0x30, 0x3A), *range(0x41, 0x5B), *range(0x61, 0x7B), *range(0x80, 0x100)])
_MEDIA = MEDIA.encode()
_NOT_PUNCT = b" \t\n\r\x0b\x0c" + _MEDIA


class UnitTuning(NamedTuple):
    """The learning's constants (``TokenUnits``' ``tuning`` argument, for the tests and the lab that want
    others). ``alpha``: a report's weight in the moving average (a plain average over the first 32);
    ``min_sample_tokens``: shorter prompts are not samples (template tokens weigh too much in them);
    ``warmup``: reports of a model before its learned value is used; ``margin``: deviations below the
    average (over-predicting costs more than under-predicting); ``max_models``: models learned at once;
    ``by_content``: value a key's bytes by class (word, punctuation, whitespace); ``min_spread``: byte
    classes whose share of a prompt varies less than this between reports keep the common value;
    ``first_chars_per_token``: the bytes per token of a cached match before the model's first report."""

    alpha: float = 1 / 32
    min_sample_tokens: int = 512
    warmup: int = 8
    margin: float = 1.0
    max_models: int = 1024
    by_content: bool = True
    min_spread: float = 0.01
    first_chars_per_token: float = FIRST_CHARS_PER_TOKEN


Counts = tuple[int, int, int, int]  # bytes of a text key by class: (word, punctuation, whitespace, images)
CHUNK = 16_384  # the key's classes are kept cumulative at every CHUNK bytes (``count_marks``)


def count_classes_py(data: bytes) -> Counts:
    """``data``'s bytes by class (word, punctuation, whitespace, image placeholder), in two passes of
    ``bytes.translate``: one over the bytes, one over the non-word bytes. The reference of the compiled
    build's C loop (``_chain.count_classes``, one vectorised pass: 10x faster on prose)."""
    other = data.translate(None, _WORD)
    media = other.count(_MEDIA)
    punct = len(other.translate(None, _NOT_PUNCT))
    return len(data) - len(other), punct, len(other) - punct - media, media


def _load_count_classes() -> Callable[[bytes], Counts]:
    try:
        from prefix_router.routing._chain import count_classes
    except ImportError:  # the pure build: the passes above
        return count_classes_py
    return count_classes


count_classes = _load_count_classes()


def count_marks(data: bytes) -> tuple[Counts, ...]:
    """The classes of ``data[:CHUNK]``, ``data[:2 x CHUNK]``, ... and of the whole (the last), cumulative:
    the same passes as one count, cut so that a prefix needs at most ``CHUNK / 2`` bytes counted."""
    marks: list[Counts] = []
    word = punct = space = media = 0
    for start in range(0, len(data), CHUNK):
        w, p, s, m = count_classes(data[start : start + CHUNK])
        word, punct, space, media = word + w, punct + p, space + s, media + m
        marks.append((word, punct, space, media))
    return tuple(marks)


def count_prefix(data: bytes, size: int, marks: tuple[Counts, ...]) -> Counts:
    """The classes of ``data[:size]`` (``size < len(data)``) from ``count_marks(data)``: from the nearer
    mark, the bytes between it and ``size`` counted and added (or taken off): at most ``CHUNK / 2``."""
    full = size // CHUNK
    below, above = full * CHUNK, min((full + 1) * CHUNK, len(data))
    if size - below <= above - size:
        w, p, s, m = count_classes(data[below:size])
        base, sign = (marks[full - 1] if full else (0, 0, 0, 0)), 1
    else:
        w, p, s, m = count_classes(data[size:above])
        base, sign = marks[full], -1
    return base[0] + sign * w, base[1] + sign * p, base[2] + sign * s, base[3] + sign * m


@dataclass(init=False, slots=True)  # a written __init__, compiled: see routing/types.py
class ContentValue:
    """A model's content value in use: tokens per byte of each class, the fit's relative residual deviation
    and its inverse moment matrix over the effective samples (for the leverage of a span's shares). A
    value, never changed once made (a new one each content sample, at a request's finish), but not
    ``frozen``: a frozen dataclass cannot have a written ``__init__``."""

    coef: tuple[float, float, float]
    deviation: float
    spread: tuple[float, ...]  # (E[x x^T] + ridge)^-1 / effective samples, row-major 3 x 3
    size: float  # the reports' average text bytes

    def __init__(
        self, coef: tuple[float, float, float], deviation: float, spread: tuple[float, ...], size: float
    ) -> None:
        self.coef = coef
        self.deviation = deviation
        self.spread = spread
        self.size = size

    def relative_margin(self, x: tuple[float, float, float], size: int) -> float:
        """The relative deviation of a span of ``size`` text bytes, shares ``x``: the fit's, widened by the
        span's leverage (a prediction interval of least squares: shares unlike the reports learned from are
        less certain) and for a span shorter than the reports by the root of the ratio (a shorter text is
        a smaller sample of words: its density varies more)."""
        m, (a, b, c) = self.spread, x
        lever = (
            a * (m[0] * a + m[1] * b + m[2] * c)
            + b * (m[3] * a + m[4] * b + m[5] * c)
            + c * (m[6] * a + m[7] * b + m[8] * c)
        )
        return self.deviation * math.sqrt((1.0 + max(0.0, lever)) * max(1.0, self.size / size))


@dataclass(slots=True)
class ContentFit:
    """One model's moving least squares of tokens per byte on the byte classes' shares (see the module
    docstring): moving moments of x = (word, punctuation, whitespace) / bytes and y = tokens / bytes."""

    samples: int = 0
    xx: list[float] = field(default_factory=lambda: [0.0] * 9)  # E[x x^T], row-major 3 x 3
    xy: list[float] = field(default_factory=lambda: [0.0] * 3)  # E[x y]
    yy: float = 0.0  # E[y^2]
    y: float = 0.0  # E[y]
    size: float = 0.0  # E[text bytes]
    value: ContentValue | None = None  # the fit (None until solvable)

    def add(self, x: tuple[float, float, float], y: float, size: int, alpha: float, spread: float) -> None:
        self.samples += 1
        a = max(alpha, 1.0 / self.samples)
        self.size += a * (size - self.size)
        x0, x1, x2 = x  # the moments unrolled (each one's update as a loop over i, j would write it)
        self.xy = [m + a * (p - m) for m, p in zip(self.xy, (x0 * y, x1 * y, x2 * y), strict=True)]
        products = (x0 * x0, x0 * x1, x0 * x2, x1 * x0, x1 * x1, x1 * x2, x2 * x0, x2 * x1, x2 * x2)
        self.xx = [m + a * (p - m) for m, p in zip(self.xx, products, strict=True)]
        self.yy += a * (y * y - self.yy)
        self.y += a * (y - self.y)
        effective = min(float(self.samples), (2.0 - alpha) / alpha)  # of a moving average of weight alpha
        self._solve(spread * spread, effective)

    def _solve(self, ridge: float, effective: float) -> None:
        """coef minimising E[(y - coef x)^2] + ridge |coef - the common value|^2 (classes whose share does
        not vary keep the common value); the residual deviation from the moments, relative to the average
        tokens per byte. A coefficient may be negative: a class can stand for text the template drops (a
        template that ignores tools drops their JSON); the value of a span is clamped, never negative."""
        xx, xy = self.xx, self.xy  # unrolled: the sums over i (and j) in the order of i, j
        inv = _inverse3([v + (ridge if k % 4 == 0 else 0.0) for k, v in enumerate(xx)])
        if inv is None or self.y <= 0:
            return
        pull = ridge * self.y
        b0, b1, b2 = xy[0] + pull, xy[1] + pull, xy[2] + pull
        c0 = inv[0] * b0 + inv[1] * b1 + inv[2] * b2
        c1 = inv[3] * b0 + inv[4] * b1 + inv[5] * b2
        c2 = inv[6] * b0 + inv[7] * b1 + inv[8] * b2
        fitted = sum((c0 * xy[0], c1 * xy[1], c2 * xy[2]))
        second = sum((c0 * c0 * xx[0], c0 * c1 * xx[1], c0 * c2 * xx[2], c1 * c0 * xx[3], c1 * c1 * xx[4],
                      c1 * c2 * xx[5], c2 * c0 * xx[6], c2 * c1 * xx[7], c2 * c2 * xx[8]))  # fmt: skip
        deviation = math.sqrt(max(0.0, self.yy - 2.0 * fitted + second)) / self.y
        self.value = ContentValue((c0, c1, c2), deviation, tuple([v / effective for v in inv]), self.size)


def _inverse3(m: list[float]) -> list[float] | None:
    """The inverse of a 3 x 3 matrix (row-major), None when singular."""
    a, b, c, d, e, f, g, h, i = m
    co = [e * i - f * h, c * h - b * i, b * f - c * e, f * g - d * i, a * i - c * g, c * d - a * f,
          d * h - e * g, b * g - a * h, a * e - b * d]  # fmt: skip
    det = a * co[0] + b * co[3] + c * co[6]
    if det <= 0.0 or not math.isfinite(det):
        return None
    return [v / det for v in co]


@dataclass(slots=True)
class ModelUnits:
    """One model's learned scale (engine tokens per nominal token) and content fit."""

    samples: int = 0
    mean: float = 1.0
    variance: float = 0.0
    clamped: int = 0  # samples outside [1/4, 4], clamped before use
    content: ContentFit = field(default_factory=ContentFit)

    def deviation(self) -> float:
        return math.sqrt(self.variance)


class TokenUnits:
    """Per model, the learned value of text keys' bytes (see the module docstring)."""

    def __init__(
        self,
        cfg: UnitSettings,
        chars_per_token: float,
        image_tokens: int = 576,
        tuning: UnitTuning | None = None,
    ) -> None:
        self.learn = cfg.learn
        self.cfg = tuning if tuning is not None else UnitTuning()
        self.chars_per_token = chars_per_token
        self._models: OrderedDict[str, ModelUnits] = OrderedDict()
        self.scales: dict[str, float] = {}  # model -> scale in use (read once per request)
        self.values: dict[str, ContentValue] = {}  # model -> content value in use (from ``warmup`` on)
        # an image placeholder: MEDIA, 16 hex digits (word bytes), MEDIA up to image_tokens x chars_per_token
        self._media_value = image_tokens / max(1, max(17, round(image_tokens * chars_per_token)) - 16)

    def scale(self, model: str | None) -> float:
        """Engine tokens per nominal token of a key of ``model`` (None: a token-id key, 1)."""
        return self.scales.get(model, 1.0) if model is not None else 1.0

    def first(self, model: str | None) -> float:
        """What a *cached match* of ``model``'s text key is worth relative to ``tokens``: 1 once the model
        has reported (here or in a sibling process), before that the conservative prior
        (``first_chars_per_token``; a prediction must not promise more cache than the engine reuses)."""
        if model is None or not self.learn:
            return 1.0
        units = self._models.get(model)
        if units is not None and units.samples:
            return 1.0
        return min(1.0, self.chars_per_token / self.cfg.first_chars_per_token)

    def by_content(self, model: str) -> bool:
        """Whether ``model``'s keys are valued by their content (learned, past the warm-up)."""
        return model in self.values

    def tokens(self, model: str | None, counts: Counts | None, nominal: float) -> float:
        """The engine tokens of a key span of ``nominal`` tokens whose bytes are ``counts`` by class: the
        content value once learned, else ``nominal`` x the scale."""
        value = self.values.get(model) if model is not None and counts is not None else None
        if value is None or counts is None:
            return nominal * self.scale(model)
        word, punct, space, media = counts
        text = word + punct + space
        if not text:
            return media * self._media_value
        a, b, c = value.coef
        margin = self.cfg.margin * value.relative_margin((word / text, punct / text, space / text), text)
        est = (a * word + b * punct + c * space) * max(0.0, 1.0 - margin)
        nominal_text = text / self.chars_per_token
        return min(max(est, nominal_text / CLAMP), nominal_text * CLAMP) + media * self._media_value

    def observe(self, model: str, nominal: int, reported: int | None, counts: Counts | None = None) -> bool:
        """Learn from a response reporting ``reported`` prompt tokens for a text key of ``nominal`` tokens
        (and ``counts`` bytes by class); returns whether it was a sample."""
        cfg = self.cfg
        if not self.learn or reported is None or nominal < cfg.min_sample_tokens:
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
        elif bounded < self.scales.get(model, 1.0):  # warming up: the lowest sample, never above nominal
            self.scales[model] = bounded
        if cfg.by_content and counts is not None:
            self._fit(model, units.content, reported, counts)
        return True

    def _fit(self, model: str, fit: ContentFit, reported: int, counts: Counts) -> None:
        """A content sample: its text bytes' shares by class and tokens per text byte (the images'
        known tokens taken off), clamped like the scale's samples."""
        word, punct, space, media = counts
        text = word + punct + space
        if text / self.chars_per_token < self.cfg.min_sample_tokens:
            return  # mostly images: their tokens are known, the text's too short to learn from
        nominal = 1.0 / self.chars_per_token
        per_byte = (reported - media * self._media_value) / text
        y = min(max(per_byte, nominal / CLAMP), nominal * CLAMP)
        fit.add((word / text, punct / text, space / text), y, text, self.cfg.alpha, self.cfg.min_spread)
        if fit.samples >= self.cfg.warmup and fit.value is not None:
            self.values[model] = fit.value

    def _units(self, model: str) -> ModelUnits:
        units = self._models.get(model)
        if units is not None:
            self._models.move_to_end(model)
            return units
        units = self._models[model] = ModelUnits()
        while len(self._models) > self.cfg.max_models:
            old, _ = self._models.popitem(last=False)
            self.scales.pop(old, None)
            self.values.pop(old, None)
        return units

    def __len__(self) -> int:
        return len(self._models)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per model: reports learned from, the learned characters per token (average and in use), the
        scale in use (engine tokens per nominal token), the samples clamped, and the content fit: tokens
        per 1,000 bytes of word, punctuation and whitespace bytes, and its relative deviation."""
        cpt = self.chars_per_token
        out: dict[str, dict[str, float]] = {}
        for model, u in self._models.items():
            fit = u.content.value
            coef, deviation = (fit.coef, fit.deviation) if fit is not None else ((0.0, 0.0, 0.0), 0.0)
            out[model] = {
                "samples": u.samples,
                "chars_per_token": cpt / u.mean,
                "chars_per_token_used": cpt / self.scale(model),
                "scale": self.scale(model),
                "deviation": u.deviation(),
                "clamped": u.clamped,
                "content_samples": u.content.samples,
                "word_tokens_per_kb": coef[0] * 1000,
                "punct_tokens_per_kb": coef[1] * 1000,
                "space_tokens_per_kb": coef[2] * 1000,
                "content_deviation": deviation,
                "content_used": model in self.values,
            }
        return out
