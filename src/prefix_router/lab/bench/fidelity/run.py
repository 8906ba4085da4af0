"""``prefix-router fidelity``: how close the router's prefix prediction is to what an engine really reuses.

For every case of the corpus and every model layout, the truth (``truth.Oracle``) is compared with what the
real ``Router`` predicts for the second request after serving the first (and indexing the reply's
extension), in three readings:

- ``exact``: exact mode (the model's template and tokenizer, blocks of ``block_tokens``);
- ``default``: the default key in character blocks, as the router values them once it has learned what the
  model's characters are worth (``routing/units.py``) from engine reports: each case is predicted by a
  router calibrated on the other half of the corpus (two folds by case name), whose requests were answered
  with ``usage.prompt_tokens`` = their token count under the real template and tokenizer, as an engine
  reports it; the pairs measured teach it nothing (held out);
- ``default-fixed``: the same, at the configured ``chars_per_token`` (4; ``routing.units.learn`` off);
- ``default-tok``: the same default key in token blocks (mode ``tokenizer``: the model's tokenizer): where
  the key says the prompts diverge, without the unit estimate.

Per reading: over-predictions (predicted > true, the costly error; for the default key, beyond one block),
predicted / true (sum over pairs, and the mean of per-pair ratios), and pairs predicted 0 that share more
than 256 tokens. Targets: exact 0 over-predictions and >= 99 % of true; default key (``default``, and the
key's position alone, ``default-tok``) no over-prediction beyond one block and >= 90 % of true on the chat
and agent cases of layouts that render system, tools, then the rest.
"""

from __future__ import annotations

import json
import tempfile
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from prefix_router.lab.bench.fidelity.corpus import Case, corpus
from prefix_router.lab.bench.fidelity.cost import Cost, measure_cost
from prefix_router.lab.bench.fidelity.models import ModelDir, all_model_dirs, smollm2_gguf
from prefix_router.lab.bench.fidelity.truth import Oracle
from prefix_router.routing import KeyBuilder, KeySettings, Outcome, Router, RoutingSettings, UnitSettings

MODES = ("exact", "default", "default-fixed", "default-tok")
FOLDS = 2
TARGET_CATEGORIES = ("chat", "agent")
BIG_SHARE = 256
TARGET_SCOPE = "chat+agent, default-order layouts"
COST_CHARS = (2_000, 16_000)


@dataclass(frozen=True, slots=True)
class Row:
    layout: str
    category: str
    case: str
    mode: str
    predicted: int
    true: int
    prompt_tokens: int
    block_tokens: int


@dataclass(frozen=True, slots=True)
class Summary:
    mode: str
    scope: str
    pairs: int
    over: int
    ratio: float
    mean_ratio: float
    zero_but_shared: int


def _reply_for(model: ModelDir, reply: dict[str, Any] | None) -> dict[str, Any] | None:
    """A reasoning model always writes a think block; its API reports the (maybe empty) reasoning."""
    if reply is None or not model.reasoning or "reasoning_content" in reply:
        return reply
    return {**reply, "reasoning_content": ""}


def _predict(router: Router, case: Case, reply: dict[str, Any] | None, worker: str) -> int:
    """The tokens predicted for the second request after the first (and its reply)."""
    router.add_worker(worker)
    try:
        first = router.keys.build("chat", case.first, route_id="1")
        decision = router.route(first, [worker], 0.0)
        router.dispatched(first, decision, 0.0)
        ext = router.keys.extend(first, "chat", case.first, reply) if reply is not None else ()
        router.finished(first, worker, Outcome(True, None, ext), 1.0)
        second = router.keys.build("chat", case.second, route_id="2")
        return router.route(second, [worker], 2.0).predicted_tokens
    finally:
        router.remove_worker(worker)


def fold(case: Case) -> int:
    """The calibration fold of ``case`` (by its name: the same split for every layout)."""
    return zlib.crc32(case.name.encode()) % FOLDS


def calibrate(router: Router, oracle: Oracle, bodies: Iterable[dict[str, Any]]) -> None:
    """Serve ``bodies`` through ``router`` as an engine would answer them: ``usage.prompt_tokens`` is their
    token count under the real template and tokenizer (what the units learn from)."""
    router.add_worker("calibration")
    for i, body in enumerate(bodies):
        req = router.keys.build("chat", body, route_id=f"c{i}")
        decision = router.route(req, ["calibration"], float(i))
        router.dispatched(req, decision, float(i))
        engine_tokens = len(oracle.ids(oracle.text(body)))
        router.finished(req, "calibration", Outcome(True, None, (), engine_tokens), float(i))
    router.remove_worker("calibration")


def default_keys(model: ModelDir, **settings: Any) -> KeySettings:
    """The default key's settings for a layout: the bodies name their model "m", so whether tools come
    before the system text (``keys.tools_before_system``) is decided by the layout's name, as a served
    name would be by the default patterns."""
    tools_first = KeyBuilder(KeySettings()).tools_first(model.name)
    return KeySettings(tools_before_system=["m"] if tools_first else [], **settings)


def calibrated(
    model: ModelDir, cases: Sequence[Case], oracle: Oracle, units: UnitSettings
) -> dict[int, Router]:
    """Per fold, a router whose units learned from the cases of the other folds."""
    routers = {}
    for k in range(FOLDS):
        router = Router(RoutingSettings(units=units, keys=default_keys(model)))
        others = [c for c in applicable(model, cases) if fold(c) != k]
        calibrate(router, oracle, (body for c in others for body in (c.first, c.second)))
        routers[k] = router
    return routers


def applicable(model: ModelDir, cases: Sequence[Case]) -> list[Case]:
    return [c for c in cases if c.category != "reasoning" or model.reasoning]


def measure(
    model: ModelDir,
    cases: Sequence[Case],
    progress: Progress | None = None,
    units: UnitSettings | None = None,
) -> list[Row]:
    oracle = Oracle(model.path, KeySettings().image_tokens)
    learned = calibrated(model, cases, oracle, units or UnitSettings())
    routers = {
        "exact": Router(RoutingSettings(keys=KeySettings(mode="template", templates={"m": str(model.path)}))),
        "default-fixed": Router(RoutingSettings(units=UnitSettings(learn=False), keys=default_keys(model))),
        "default-tok": Router(
            RoutingSettings(
                keys=default_keys(model, mode="tokenizer", tokenizer=str(model.path / "tokenizer.json"))
            )
        ),
    }
    rows: list[Row] = []
    task = progress.add_task(model.name, total=len(cases)) if progress else None
    for i, case in enumerate(cases):
        if progress is not None and task is not None:
            progress.advance(task)
        if case.category == "reasoning" and not model.reasoning:
            continue
        reply = _reply_for(model, case.reply)
        true, size = oracle.truth(case.first, reply, case.second)
        for mode, router in {**routers, "default": learned[fold(case)]}.items():
            got = _predict(router, case, reply, f"w{i}")
            rows.append(
                Row(model.name, case.category, case.name, mode, got, true, size, router.cfg.keys.block_tokens)
            )
    return rows


def _over(row: Row) -> bool:
    slack = 0 if row.mode == "exact" else row.block_tokens
    return row.predicted > row.true + slack


def summarize(rows: Iterable[Row], mode: str, scope: str) -> Summary:
    chosen = [r for r in rows if r.mode == mode]
    pred = sum(r.predicted for r in chosen)
    true = sum(r.true for r in chosen)
    ratios = [r.predicted / r.true for r in chosen if r.true > 0]
    return Summary(
        mode=mode,
        scope=scope,
        pairs=len(chosen),
        over=sum(_over(r) for r in chosen),
        ratio=pred / true if true else 1.0,
        mean_ratio=sum(ratios) / len(ratios) if ratios else 1.0,
        zero_but_shared=sum(r.predicted == 0 and r.true > BIG_SHARE for r in chosen),
    )


def in_target(row: Row, model: ModelDir) -> bool:
    """The default key's target scope: chat and agent cases of layouts that render system, tools, then the
    rest (agent cases only where the template renders tools at all)."""
    if not model.default_order or row.category not in TARGET_CATEGORIES:
        return False
    return row.category != "agent" or model.renders_tools


def summaries(rows: Sequence[Row], models: Sequence[ModelDir]) -> list[Summary]:
    """Per mode: everything, the target scope, and each layout and category."""
    by_name = {m.name: m for m in models}
    target = [r for r in rows if in_target(r, by_name[r.layout])]
    out = []
    for mode in MODES:
        out.append(summarize(rows, mode, "all"))
        out.append(summarize(target, mode, TARGET_SCOPE))
        for layout in dict.fromkeys(r.layout for r in rows):
            for category in dict.fromkeys(r.category for r in rows if r.layout == layout):
                part = [r for r in rows if r.layout == layout and r.category == category]
                out.append(summarize(part, mode, f"{layout} / {category}"))
    return out


# reading -> (scope, least share of true); and no over-prediction (beyond a block for the default key)
TARGETS = {"exact": ("all", 0.99), "default-tok": (TARGET_SCOPE, 0.90), "default": (TARGET_SCOPE, 0.90)}


def meets_targets(found: Sequence[Summary]) -> list[str]:
    """The targets missed (empty when all are met), each line starting with its reading's name."""
    missed = []
    for s in found:
        scope, share = TARGETS.get(s.mode, ("", 0.0))
        if s.scope == scope and (s.over or s.ratio < share):
            beyond = "" if s.mode == "exact" else " beyond a block"
            missed.append(f"{s.mode}: {s.over} over-predictions{beyond}, {s.ratio:.3f} of true ({scope})")
    return missed


def table(found: Sequence[Summary], console: Console) -> None:
    out = Table(title="Routing fidelity (truth: longest common token prefix, real template + tokenizer)")
    for col in (
        "mode",
        "scope",
        "pairs",
        "over-predicted",
        "predicted/true",
        "mean ratio",
        "0 but >256 shared",
    ):
        out.add_column(col)
    for s in found:
        out.add_row(s.mode, s.scope, str(s.pairs), str(s.over), f"{s.ratio:.3f}", f"{s.mean_ratio:.3f}",
                    str(s.zero_but_shared))  # fmt: skip
    console.print(out)


def run(
    model_dir: Path | None, size: str, json_out: Path | None, gguf: Path | None, cost: bool = True
) -> int:
    console = Console()
    cases = corpus(size)
    with tempfile.TemporaryDirectory(prefix="prefix-router-fidelity-") as tmp:
        models = _models(model_dir, gguf, Path(tmp))
        if not models:
            console.print("[red]no model: give --model-dir, or install the SmolLM2 GGUF (make llama)[/]")
            return 2
        rows: list[Row] = []
        with Progress(console=console, transient=True) as progress:
            for model in models:
                rows += measure(model, cases, progress)
        costs = [measure_cost(models[0].path, chars) for chars in COST_CHARS] if cost else []
    found = summaries(rows, models)
    table([s for s in found if "/" not in s.scope] if size == "full" else found, console)
    if costs:
        cost_table(costs, models[0].name, console)
    missed = meets_targets(found)
    for line in missed:
        console.print(f"[yellow]target missed: {line}[/]")
    if json_out is not None:
        payload = {
            "summaries": [asdict(s) for s in found],
            "costs": [asdict(c) for c in costs],
            "missed": missed,
            "rows": [asdict(r) for r in rows],
        }
        json_out.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    return 0


def cost_table(costs: Sequence[Cost], model: str, console: Console) -> None:
    out = Table(title=f"Routing key cost per request ({model}; medians of interleaved rounds, one run)")
    for col in ("body chars", "default key µs", "token-block key µs", "exact key µs", "exact / default"):
        out.add_column(col)
    for c in costs:
        out.add_row(f"{c.chars:,}", f"{c.default_us:,.0f}", f"{c.tokens_us:,.0f}", f"{c.exact_us:,.0f}",
                    f"{c.exact_us / c.default_us:,.0f}x")  # fmt: skip
    console.print(out)


def _models(model_dir: Path | None, gguf: Path | None, work: Path) -> list[ModelDir]:
    if model_dir is not None:
        template = (model_dir / "tokenizer_config.json").read_text(encoding="utf-8")
        return [ModelDir(model_dir.name, model_dir, True, "think>" in template, "tools" in template)]
    source = gguf or smollm2_gguf()
    return all_model_dirs(source, work) if source is not None else []
