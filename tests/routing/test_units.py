"""Token units of text keys (``routing/units.py``): learned per model from engine reports (moving average
less a margin of deviations, clamped samples, warm-up, bounded table; and by content: the bytes' classes
valued by a moving least squares), and applied by the router wherever a key's tokens are used: the
prediction (a match by its own blocks' classes), the load tracker, the policy's cost and the index's
capacity."""

from __future__ import annotations

import math
import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefix_router.routing.canonical import MEDIA
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings, UnitSettings
from prefix_router.routing.types import Outcome, RouteRequest
from prefix_router.routing.units import (
    CHUNK,
    CLAMP,
    ContentFit,
    ContentValue,
    TokenUnits,
    UnitTuning,
    _inverse3,
    count_classes,
    count_marks,
    count_prefix,
)
from support.routing import new_router

BLOCKS = 100  # blocks of 16 nominal tokens (64 characters at 4 per token)


def units(learn: bool = True, **knobs: object) -> TokenUnits:
    return TokenUnits(UnitSettings(learn=learn), chars_per_token=4.0, tuning=UnitTuning(**knobs))  # type: ignore[arg-type]


def text_req(rid: str, tag: int = 1, blocks: int = BLOCKS, model: str | None = "m") -> RouteRequest:
    chain = tuple(tag * 10_000 + i for i in range(blocks))
    return RouteRequest(rid, chain, 16, 16 * blocks + 3, chain[0], text_model=model)


def make_router(learn: bool = True, **units_knobs: object) -> Router:
    settings = {"index": {"worker_capacity_tokens": 16 * 1000}, "units": {"learn": learn}}
    return new_router(settings, units=UnitTuning(**units_knobs))  # type: ignore[arg-type]


def serve(router: Router, req: RouteRequest, engine_tokens: int | None, now: float = 0.0) -> int:
    decision = router.route(req, ["a"], now)
    router.dispatched(req, decision, now)
    router.first_token(req.route_id, now)
    router.finished(req, "a", Outcome(True, None, (), engine_tokens), now)
    return decision.predicted_tokens


# ---------------------------------------------------------------- learning


def test_the_lowest_sample_is_used_before_the_warmup_and_then_the_average_less_the_margin() -> None:
    table = units(warmup=4, margin=1.0)
    samples = [0.82, 0.78, 0.8, 0.8]
    assert table.scale("m") == 1.0  # never reported: the configured chars_per_token
    for i, sample in enumerate(samples):
        assert table.observe("m", 1000, round(sample * 1000))
        if i < 3:  # warming up: the lowest sample so far
            assert table.scale("m") == pytest.approx(min(samples[: i + 1]))
    mean = sum(samples) / 4
    deviation = math.sqrt(sum((s - mean) ** 2 for s in samples) / 4)
    assert table.scale("m") == pytest.approx(mean - deviation, abs=1e-9)
    assert table.summary()["m"]["chars_per_token"] == pytest.approx(4.0 / mean)
    assert table.scale("other") == 1.0 and table.scale(None) == 1.0


def test_warming_up_the_scale_never_rises_above_nominal() -> None:
    table = units(warmup=4)
    assert table.observe("code", 1000, 1300)  # sparser text than nominal: over-predicting is the risk
    assert table.scale("code") == 1.0


def test_the_average_moves_by_alpha_once_past_its_window() -> None:
    table = units(alpha=0.25, warmup=1, margin=0.0)
    for _ in range(8):
        table.observe("m", 1000, 800)
    table.observe("m", 1000, 1200)
    assert table.scale("m") == pytest.approx(0.8 + 0.25 * 0.4)


@given(st.lists(st.integers(1, 1 << 31), min_size=1, max_size=50))
def test_samples_are_clamped_so_no_report_moves_the_scale_out_of_its_bounds(reports: list[int]) -> None:
    table = units(warmup=1, margin=0.0)
    for reported in reports:
        table.observe("m", 1000, reported)
    assert 1 / CLAMP <= table.scale("m") <= CLAMP
    assert table.summary()["m"]["clamped"] == sum(not 250 <= r <= 4000 for r in reports)


def test_short_prompts_insane_reports_and_learning_off_teach_nothing() -> None:
    table = units(min_sample_tokens=512, warmup=1)
    assert not table.observe("m", 511, 400)  # a template's tokens would weigh too much
    assert not table.observe("m", 1000, None)  # the engine reported no usage
    assert not table.observe("m", 1000, 0) and not table.observe("m", 1000, -5)
    assert not table.observe("m", 1000, (1 << 31) + 1)
    assert len(table) == 0 and table.scale("m") == 1.0
    off = units(learn=False, warmup=1)
    assert not off.observe("m", 1000, 800) and off.scale("m") == 1.0


def test_the_table_holds_at_most_max_models_dropping_the_least_recently_reported() -> None:
    table = units(max_models=3, warmup=1, margin=0.0)
    for i in range(10):
        table.observe(f"model-{i}", 1000, 800)
        assert len(table) <= 3 and len(table.scales) <= 3
    table.observe("model-7", 1000, 800)  # reported again: the most recent
    table.observe("model-new", 1000, 800)
    assert set(table.summary()) == {"model-9", "model-7", "model-new"}
    assert table.scale("model-8") == 1.0  # its learned value went with it


# ---------------------------------------------------------------- the router applies it


def test_after_the_warmup_a_repeat_is_predicted_at_the_engines_count_never_above() -> None:
    router = make_router(margin=0.0)
    nominal = 16 * BLOCKS + 3
    engine = round(nominal / 1.25)  # 5 characters per token where 4 were assumed
    assert serve(router, text_req("first"), engine) == 0
    early = serve(router, text_req("repeat-early"), engine)  # warming up: valued at the first report
    assert engine - 16 <= early <= engine
    for i in range(8):
        serve(router, text_req(f"warm{i}", tag=2 + i), engine)
    got = serve(router, text_req("repeat"), engine)
    assert engine - 16 <= got <= engine
    assert router.summary()["units"]["m"]["samples"] == 11  # type: ignore[index]


def test_the_load_tracker_and_the_drain_count_the_scaled_prompt() -> None:
    router = make_router(warmup=1, margin=0.0)
    serve(router, text_req("teach"), 800 * 2)  # 2 engine tokens per nominal token
    req = text_req("new", tag=7)
    decision = router.route(req, ["a"], 1.0)
    router.dispatched(req, decision, 1.0)
    assert router.estimated_prompt_tokens(req) == math.ceil(req.key_tokens * router.units.scale("m"))
    assert router.load.snapshot("a", 1.0).pending_prefill_tokens == router.estimated_prompt_tokens(req)


def test_token_id_keys_are_never_scaled() -> None:
    router = make_router(warmup=1, margin=0.0)
    serve(router, text_req("teach"), 800)  # text of model m: half a token per nominal token
    ids = text_req("ids", model=None)
    serve(router, ids, 800)  # a token-id key's report teaches nothing ...
    assert router.units.summary()["m"]["samples"] == 1
    assert serve(router, text_req("ids-again", model=None), None) == 16 * BLOCKS  # ... nor is it scaled


def test_the_prefix_policy_weighs_the_scaled_tokens() -> None:
    """Worker "a" holds 30 of the request's 40 blocks and has a request in flight (a fixed penalty of 512
    token-equivalents); "b" is idle. Nominally (643 tokens) recomputing all of it on "b" is cheaper than
    the penalty plus 163 tokens on "a"; where the engine counts twice as many tokens, it is not."""
    chosen = {}
    for learned in (False, True):
        router = make_router(learn=learned, warmup=1, margin=0.0)
        router.add_worker("b")
        serve(router, text_req("teach", tag=50), (16 * BLOCKS + 3) * 2)  # 2 engine tokens per nominal one
        hot = text_req("hot", tag=9, blocks=30)
        router.dispatched(hot, router.route(hot, ["a"], 0.0), 0.0)
        router.first_token("hot", 0.0)  # in flight on "a", its prefill done
        chosen[learned] = router.route(text_req("again", tag=9, blocks=40), ["a", "b"], 0.1).worker
    assert chosen == {False: "b", True: "a"}


def test_the_index_keeps_a_workers_capacity_in_tokens_when_its_blocks_are_worth_less() -> None:
    router = make_router(warmup=1, margin=0.0)
    index = router.index
    assert (index.capacity_blocks("a"), index.ceiling_tokens("a")) == (1000, 16_000)
    serve(router, text_req("teach"), (16 * BLOCKS + 3) * 4 // 5)  # 0.8: a block is 12.8 tokens
    assert index.block_value("a") == pytest.approx(16 * 0.8, rel=1e-3)
    assert index.capacity_blocks("a") == 1250  # 16,000 tokens of 12.8-token blocks
    assert index.ceiling_tokens("a") == index.capacity_tokens("a") == pytest.approx(16_000, abs=13)
    index.set_block_value("a", 12.81)  # a move under 1/64: nothing changes
    assert index.block_value("a") == pytest.approx(12.8, rel=1e-3)
    index.insert("a", tuple(range(1, 901)), 1.0)
    assert index.blocks_of("a") == 1000
    index.set_block_value("a", 32.0)  # denser: fewer blocks fit, the oldest are evicted
    assert index.ceiling_tokens("a") == 16_000 and index.capacity_blocks("a") in (499, 500)
    assert index.blocks_of("a") == index.capacity_blocks("a") and index.evictions == 1000 - index.blocks_of(
        "a"
    )
    router.remove_worker("a")
    router.add_worker("a")
    assert index.block_value("a") == 16  # a new worker of the same name starts nominal


def test_retune_refuses_new_units_knobs() -> None:
    router = make_router()
    with pytest.raises(ValueError, match="units"):
        router.retune(RoutingSettings.model_validate({"units": {"learn": False}}))


# ---------------------------------------------------------------- by content (byte classes)

WORDS = [
    "the",
    "of",
    "cache",
    "token",
    "engine",
    "request",
    "prefix",
    "router",
    "worker",
    "model",
    "infrastructure",
    "serialization",
    "a",
    "to",
]
TOY = re.compile(r" ?[A-Za-z0-9]{1,6}|[^A-Za-z0-9\s]|\s+")  # a toy tokenizer: word pieces, punctuation


def toy_tokens(text: str) -> int:
    """A stand-in engine tokenizer, apart from the byte classes: a piece of a word (with the space before
    it) per token up to 6 characters, each punctuation character a token, other whitespace a token."""
    return len(TOY.findall(text))


def prose(rng: random.Random, chars: int) -> str:
    out = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(rng.choice(WORDS) + ("." if rng.random() < 0.08 else ""))
    return " ".join(out)


def tools(rng: random.Random, n: int) -> list[dict[str, object]]:
    return [
        {"type": "function", "function": {"name": f"{rng.choice(WORDS)}_{i}", "parameters": {
            "type": "object", "properties": {w: {"type": "string", "enum": [str(rng.randint(1, 99))]}
                                             for w in rng.sample(WORDS, 4)}}}}
        for i in range(n)
    ]  # fmt: skip


def body(
    rng: random.Random, system_chars: int, n_tools: int, question: str = "what next?"
) -> dict[str, object]:
    out: dict[str, object] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": prose(rng, system_chars)},
            {"role": "user", "content": question},
        ],
    }
    if n_tools:
        out["tools"] = tools(rng, n_tools)
    return out


def engine_tokens(router: Router, req: RouteRequest) -> int:
    return toy_tokens(req.text.decode())


def serve_text(router: Router, req: RouteRequest, now: float = 0.0) -> int:
    return serve(router, req, engine_tokens(router, req), now)


def test_bytes_are_counted_by_class_in_marks_any_prefix_adds_up() -> None:
    data = 'Héllo, "wörld": {x: 12}\n\t  ok'.encode() + MEDIA.encode() * 3
    word, punct, space, media = count_classes(data)
    assert media == 3 and space == 7  # the image placeholder's bytes are no punctuation
    assert punct == len(',"":{:}') and word == len(data) - punct - space - media  # é, ö: 2 word bytes each
    assert count_classes(b"") == (0, 0, 0, 0) and count_marks(b"") == ()


@given(st.binary(max_size=3 * CHUNK + 100), st.integers(0, 3 * CHUNK + 100))
def test_a_prefix_from_the_marks_is_the_count_of_that_prefix(data: bytes, size: int) -> None:
    marks = count_marks(data)
    assert marks[-1:] == ((count_classes(data),) if data else ())
    size = min(size, max(0, len(data) - 1))
    assert count_prefix(data, size, marks) == count_classes(data[:size])


def test_the_value_by_class_learns_a_linear_engine_that_one_scale_cannot_follow() -> None:
    """Engine tokens = 0.2 per word byte + 0.9 per punctuation byte + 0.05 per whitespace byte: prompts of
    prose and of JSON alternate. By class, both kinds are valued within 2 % (the ridge pulls a little);
    one value per model is off by more than 5 % on each."""
    table = units(warmup=4, margin=0.0)
    kinds = {"prose": (8_000, 100, 1_600), "json": (5_000, 2_400, 1_200)}  # word, punct, space bytes

    def truth(w: int, p: int, s: int) -> float:
        return 0.2 * w + 0.9 * p + 0.05 * s

    for i in range(20):
        w, p, s = kinds["prose" if i % 2 else "json"]
        w += 37 * i  # not exactly collinear
        table.observe("m", (w + p + s) // 4, round(truth(w, p, s)), (w, p, s, 0))
    assert table.by_content("m") and table.summary()["m"]["content_deviation"] < 0.01
    for w, p, s in kinds.values():
        nominal = (w + p + s) / 4
        assert table.tokens("m", (w, p, s, 0), nominal) == pytest.approx(truth(w, p, s), rel=0.02)
        assert abs(nominal * table.scale("m") / truth(w, p, s) - 1) > 0.05


def test_images_are_worth_image_tokens_and_spans_stay_within_the_clamp() -> None:
    table = TokenUnits(
        UnitSettings(), chars_per_token=4.0, image_tokens=100, tuning=UnitTuning(warmup=1, margin=0.0)
    )
    table.observe("m", 2_000, 1_600, (6_000, 500, 1_500, 0))
    placeholder = 400 - 16  # 100 tokens at 4 bytes each, less the 16 hex digits of the image's name
    text = table.tokens("m", (600, 50, 150, 0), 200)
    assert table.tokens("m", (616, 50, 150, placeholder), 300) == pytest.approx(
        text + 100 + 16 * 0.2, rel=0.02
    )
    assert table.tokens("m", (0, 0, 0, placeholder), 96) == pytest.approx(100)
    for counts in [(0, 4_000, 0, 0), (0, 0, 4_000, 0), (4_000, 0, 0, 0)]:  # far from what was learned
        assert 1_000 / CLAMP <= table.tokens("m", counts, 1_000) <= 1_000 * CLAMP


def test_a_short_span_or_one_unlike_the_reports_gets_a_wider_margin() -> None:
    table = units(warmup=4, margin=1.0)
    rng = random.Random(3)
    for _ in range(30):
        w, p, s = 8_000 + rng.randint(-500, 500), 300 + rng.randint(-100, 100), 1_500
        table.observe(
            "m", (w + p + s) // 4, round((0.2 * w + 0.7 * p) * rng.uniform(0.97, 1.03)), (w, p, s, 0)
        )
    per_byte = [table.tokens("m", (80 * k, 3 * k, 15 * k, 0), 24.5 * k) / (98 * k) for k in (100, 10, 1)]
    assert per_byte[0] > per_byte[1] > per_byte[2]  # 9,800 bytes (like the reports), 980, 98
    like = table.tokens("m", (8_000, 300, 1_500, 0), 2_450)
    unlike = table.tokens("m", (8_000, 3_000, 1_500, 0), 3_125)
    fitted = 0.2 * 8_000 + 0.7 * 3_000
    assert like <= 0.2 * 8_000 + 0.7 * 300 and unlike < fitted * 0.95  # the leverage of shares never seen


def test_off_or_before_the_warmup_the_scale_values_the_bytes() -> None:
    for knobs in ({"by_content": False, "warmup": 1}, {"warmup": 5}):
        table = units(**knobs)
        for _ in range(4):
            table.observe("m", 2_500, 2_000, (8_000, 500, 1_500, 0))
        assert not table.by_content("m") and table.values == {}
        assert table.tokens("m", (8_000, 500, 1_500, 0), 2_500) == 2_500 * table.scale("m")


def test_the_content_value_is_bounded_by_max_models() -> None:
    table = units(max_models=3, warmup=1)
    for i in range(10):
        table.observe(f"model-{i}", 2_500, 2_000, (8_000, 500, 1_500, 0))
        assert len(table.values) <= 3
    assert set(table.values) == {"model-7", "model-8", "model-9"}


def test_the_router_values_a_match_by_the_content_of_its_own_blocks() -> None:
    """After a warm-up of chats with and without tool lists (the engine: the toy tokenizer), a repeat of a
    prose-only prompt and of a tool-heavy one are each predicted within a block of the engine's count (and
    at most 6 % below), and so is a prompt that shares only the system prompt of a tool-heavy one (the
    match is prose: not valued at the whole prompt's density). One value per model, a lower bound for
    both kinds, predicts the tool-heavy repeat at under 80 % of its tokens."""
    got: dict[bool, dict[str, tuple[int, int]]] = {}
    for by_content in (True, False):
        router = make_router(by_content=by_content)
        rng = random.Random(7)
        for i in range(16):
            serve_text(
                router, router.keys.build("chat", body(rng, 4_000 + 300 * i, 6 * (i % 2)), route_id=f"w{i}")
            )
        rng = random.Random(99)
        chat, agent = body(rng, 6_000, 0), body(rng, 3_000, 12)
        other = {**agent, "messages": [agent["messages"][0], {"role": "user", "content": "x"}],  # type: ignore[index]
                 "tools": tools(random.Random(5), 12)}  # fmt: skip
        out = {}
        for name, first, second in (("chat", chat, chat), ("agent", agent, agent), ("shared", agent, other)):
            a = router.keys.build("chat", first, route_id=f"{name}-1")
            serve_text(router, a)
            b = router.keys.build("chat", second, route_id=f"{name}-2")
            decision = router.route(b, ["a"], 1.0)
            shared = b.text[: decision.matched_blocks * 64].decode()
            out[name] = (decision.predicted_tokens, toy_tokens(shared))
            router.finished(b, "a", Outcome(True), 1.0)
        got[by_content] = out
    for name, (predicted, truth) in got[True].items():
        assert truth * 0.94 - 16 <= predicted <= truth + 16, name  # within a block above (the target)
    assert got[True]["shared"][1] < got[True]["agent"][1] / 2  # the system prompt only
    predicted, truth = got[False]["agent"]  # one value, a lower bound over prose and JSON alike ...
    assert predicted < 0.8 * truth  # ... leaves most of the tool list's tokens out


class LoopFit:
    """The content fit's moving moments and solution written as loops over the classes (the definition
    ``ContentFit``'s unrolled code must follow float for float)."""

    def __init__(self) -> None:
        self.samples, self.size, self.yy, self.y = 0, 0.0, 0.0, 0.0
        self.xx, self.xy = [0.0] * 9, [0.0] * 3
        self.value: ContentValue | None = None

    def add(self, x: tuple[float, float, float], y: float, size: int, alpha: float, spread: float) -> None:
        self.samples += 1
        a = max(alpha, 1.0 / self.samples)
        self.size += a * (size - self.size)
        for i in range(3):
            self.xy[i] += a * (x[i] * y - self.xy[i])
            for j in range(3):
                self.xx[3 * i + j] += a * (x[i] * x[j] - self.xx[3 * i + j])
        self.yy += a * (y * y - self.yy)
        self.y += a * (y - self.y)
        effective = min(float(self.samples), (2.0 - alpha) / alpha)
        ridge = spread * spread
        inv = _inverse3([self.xx[k] + (ridge if k % 4 == 0 else 0.0) for k in range(9)])
        if inv is None or self.y <= 0:
            return
        b = [self.xy[i] + ridge * self.y for i in range(3)]
        coef = (
            inv[0] * b[0] + inv[1] * b[1] + inv[2] * b[2],
            inv[3] * b[0] + inv[4] * b[1] + inv[5] * b[2],
            inv[6] * b[0] + inv[7] * b[1] + inv[8] * b[2],
        )
        fitted = sum(coef[i] * self.xy[i] for i in range(3))
        second = sum(coef[i] * coef[j] * self.xx[3 * i + j] for i in range(3) for j in range(3))
        deviation = math.sqrt(max(0.0, self.yy - 2.0 * fitted + second)) / self.y
        self.value = ContentValue(coef, deviation, tuple(v / effective for v in inv), self.size)


SHARE = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(
    st.lists(
        st.tuples(SHARE, SHARE, SHARE, st.floats(0.01, 2.0), st.integers(1, 100_000)), min_size=1, max_size=60
    ),
    st.sampled_from([1 / 32, 0.5, 1.0]),
    st.sampled_from([0.0, 0.01, 0.3]),
)
def test_the_unrolled_content_fit_is_the_loops_float_for_float(
    samples: list[tuple[float, float, float, float, int]], alpha: float, spread: float
) -> None:
    fit, loops = ContentFit(), LoopFit()
    for word, punct, space, y, size in samples:
        total = word + punct + space or 1.0
        x = (word / total, punct / total, space / total)
        fit.add(x, y, size, alpha, spread)
        loops.add(x, y, size, alpha, spread)
        assert (fit.xx, fit.xy, fit.yy, fit.y, fit.size) == (
            loops.xx,
            loops.xy,
            loops.yy,
            loops.y,
            loops.size,
        )
        assert repr(fit.value) == repr(loops.value)


# ---------------------------------------------------------------- the first prediction


def test_a_model_never_reported_has_its_matches_valued_by_the_conservative_prior() -> None:
    """Before a model's first report its cached match is worth 4/8 of nominal (``first_chars_per_token``):
    a tokenizer of 6 bytes per token (SmolLM2's prose) reuses 2/3 of nominal, which the nominal 4 bytes
    per token over-predicted (1,104 predicted, 739 reused on llama.cpp); the first report lifts the prior,
    for that model only, and a token-id key (no model) is never discounted."""
    u = units()
    assert u.first("m") == 0.5
    assert u.first(None) == 1.0
    assert units(learn=False).first("m") == 1.0  # not learning: the configured value is the operator's
    assert units(first_chars_per_token=2.0).first("m") == 1.0  # never above the nominal value
    assert u.observe("m", 1_000, 900)
    assert u.first("m") == 1.0
    assert u.first("other") == 0.5
    assert not u.observe("short", 100, 60)  # not a sample: still unreported
    assert u.first("short") == 0.5


def test_the_first_repeat_is_predicted_no_higher_than_a_dense_tokenizer_reuses() -> None:
    """An identical repeat of a prompt whose engine counts 6 bytes per token (2/3 of nominal) is predicted
    at no more than the engine's tokens before any report, and at the whole once it has reported."""
    router = make_router()
    first, again, third = text_req("1"), text_req("2"), text_req("3")
    engine_tokens = first.key_tokens * 2 // 3
    router.dispatched(first, router.route(first, ["a"], 0.0), 0.0)
    predicted = router.route(again, ["a"], 1.0).predicted_tokens
    assert 0 < predicted <= engine_tokens
    router.first_token(first.route_id, 1.0)
    router.finished(first, "a", Outcome(True, None, (), engine_tokens), 1.0)
    learned = router.route(third, ["a"], 2.0).predicted_tokens
    assert predicted < learned <= engine_tokens
    assert learned >= engine_tokens - 16
