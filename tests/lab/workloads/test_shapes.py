from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest

from prefix_router.lab.workloads import agents, bursty, chatbots, mooncake, multiturn, presets, rag, unique
from prefix_router.lab.workloads.text import estimate_tokens, random_text, rng_for, tagged_text


def _system(session: chatbots.Session) -> str:
    return str(session.preamble[0]["content"])


def _user(session: chatbots.Session) -> str:
    return str(session.turns[0].messages[-1]["content"])


def test_random_text_is_deterministic_and_sized() -> None:
    a = random_text(rng_for("x", 1), 100)
    assert a == random_text(rng_for("x", 1), 100)
    assert a != random_text(rng_for("x", 2), 100)
    assert len(a) == 400 and estimate_tokens(a) == 100
    assert tagged_text("t", rng_for("y"), 50).startswith("[t] ")


def test_chatbots_share_system_prompt_within_tenant_only() -> None:
    sessions = chatbots.build(chatbots.ChatbotSettings(tenants=5, system_tokens=64), 300, seed=3)
    by_tenant: dict[str | None, set[str]] = {}
    for s in sessions:
        by_tenant.setdefault(s.tenant, set()).add(_system(s))
    assert all(len(prompts) == 1 for prompts in by_tenant.values())
    heads = [next(iter(p))[:16] for p in by_tenant.values()]
    assert len(set(heads)) == len(heads)
    assert len({_user(s) for s in sessions}) == len(sessions)


def test_chatbots_zipf_popularity_ranks_tenants() -> None:
    sessions = chatbots.build(chatbots.ChatbotSettings(tenants=8, zipf_s=1.2, system_tokens=8), 4000, seed=1)
    counts = Counter(s.tenant for s in sessions)
    assert counts["tenant-0"] > counts["tenant-1"] > counts["tenant-7"]
    uniform = chatbots.build(chatbots.ChatbotSettings(tenants=4, zipf_s=0.0, system_tokens=8), 4000, seed=1)
    assert max(Counter(s.tenant for s in uniform).values()) < 1150


def test_system_prompt_length_range() -> None:
    opts = chatbots.ChatbotSettings(tenants=20, system_tokens=10, system_tokens_max=40)
    lengths = {len(p) for p in chatbots.system_prompts(opts, 0)}
    assert min(lengths) >= 40 and max(lengths) <= 160 and len(lengths) > 3


def test_unique_shares_nothing() -> None:
    prompts = [_user(s) for s in unique.build(unique.UniqueSettings(prompt_tokens=64), 500, seed=9)]
    assert len({p[:16] for p in prompts}) == len(prompts)
    assert all(len(p) == 256 for p in prompts)


def test_rag_requests_share_whole_documents() -> None:
    sessions = rag.build(rag.RagSettings(documents=3, document_tokens=200), 60, seed=2)
    docs = Counter(_user(s).split("</document>")[0] for s in sessions)
    assert len(docs) == 3 and all(len(d) > 800 for d in docs)
    assert len({_user(s) for s in sessions}) == 60


def test_multiturn_turns_follow_human_messages(sharegpt_file: Path) -> None:
    opts = multiturn.MultiTurnSettings(trace=str(sharegpt_file), max_user_tokens=32, shuffle=False)
    sessions = multiturn.build(opts, 100, seed=0)
    assert [len(s.turns) for s in sessions] == [3, 4, 3, 4, 3, 4]
    first = sessions[0].turns
    assert str(first[0].messages[0]["content"]).startswith("conv 0 question 0")
    assert all(t.scripted_reply is None for s in sessions for t in s.turns)
    assert len(str(first[1].messages[0]["content"])) == 128  # truncated to 32 tokens
    assert first[0].max_tokens == min(64, estimate_tokens("answer " * 20))


def test_multiturn_takes_exactly_the_requested_turns(sharegpt_file: Path) -> None:
    opts = multiturn.MultiTurnSettings(trace=str(sharegpt_file))
    sessions = multiturn.build(opts, 9, seed=4)
    assert sum(len(s.turns) for s in sessions) == 9
    assert sessions == multiturn.build(opts, 9, seed=4)
    assert [s.session_id for s in sessions] != [s.session_id for s in multiturn.build(opts, 9, seed=5)]


def test_multiturn_missing_trace_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        multiturn.build(multiturn.MultiTurnSettings(trace=str(tmp_path / "nope.jsonl")), 5, seed=0)


def test_agents_tool_loop_structure() -> None:
    opts = agents.AgentSettings(steps=3, tool_output_tokens=20, tool_output_growth=2.0)
    sessions = agents.build(opts, 40, seed=1)
    assert sum(len(s.turns) for s in sessions) == 40
    s = sessions[0]
    assert len(s.turns) == 4 and s.tools and s.preamble[0]["role"] == "system"
    calls = [t.scripted_reply for t in s.turns[:-1]]
    assert all(c is not None and c["tool_calls"][0]["function"]["name"] for c in calls)
    assert s.turns[-1].scripted_reply is None
    outputs = [t.messages[0] for t in s.turns[1:]]
    assert [o["tool_call_id"] for o in outputs] == [c["tool_calls"][0]["id"] for c in calls if c]
    sizes = [len(o["content"]) for o in outputs]
    assert sizes == sorted(sizes) and sizes[-1] == 4 * sizes[0]


def test_agents_of_one_kind_share_system_and_tools() -> None:
    sessions = agents.build(agents.AgentSettings(kinds=2), 100, seed=0)
    by_kind: dict[str | None, set[str]] = {}
    for s in sessions:
        by_kind.setdefault(s.tenant, set()).add(_system(s) + repr(s.tools))
    assert len(by_kind) == 2 and all(len(v) == 1 for v in by_kind.values())


def test_mooncake_equal_ids_give_equal_prefixes(mooncake_file: Path) -> None:
    opts = mooncake.MooncakeSettings(trace=str(mooncake_file), block_tokens=16)
    sessions = mooncake.build(opts, 10, seed=0)
    prompts = [s.turns[0].prompt or "" for s in sessions]
    block = 16 * 4
    assert prompts[0][: 2 * block] == prompts[1][: 2 * block]
    assert prompts[0][: 3 * block] != prompts[1][: 3 * block]
    assert prompts[0][:block] == prompts[2][:block] and prompts[0][: 2 * block] != prompts[2][: 2 * block]
    assert prompts[3][:8] != prompts[0][:8]
    assert [len(p) for p in prompts] == [round(n * 16 / 512) * 4 for n in (1500, 1200, 700, 2048)]
    assert sessions[0].turns[0].max_tokens == round(100 * 16 / 512)


def test_mooncake_arrivals_spread_within_buckets(mooncake_file: Path) -> None:
    sessions = mooncake.build(mooncake.MooncakeSettings(trace=str(mooncake_file), block_tokens=16), 10, 0)
    arrivals = [s.arrival_s for s in sessions]
    assert min(arrivals) == 0.0 and max(arrivals) < 9.0
    assert arrivals[3] >= 3.0


def test_block_text_cache_is_bounded() -> None:
    texts = mooncake.BlockTexts(seed=0, block_tokens=4, capacity=3)
    first = texts.get(1)
    for hash_id in range(2, 10):
        texts.get(hash_id)
        assert len(texts) <= 3
    assert texts.get(1) == first


def test_gsp_preset_matches_sglang_shape() -> None:
    sessions = presets.build_gsp(presets.GspSettings(), 1024, seed=0)
    prompts = [s.turns[0].prompt or "" for s in sessions]
    groups = Counter(p[: 2048 * 4] for p in prompts)
    assert len(groups) == 64 and set(groups.values()) == {16}
    assert all(len(p) == (2048 + 128) * 4 + 2 for p in prompts)
    assert {s.turns[0].max_tokens for s in sessions} == {256}
    assert len({s.session_id for s in sessions}) == 1024


def test_prefix_repetition_preset_matches_vllm_shape() -> None:
    sessions = presets.build_prefix_repetition(presets.PrefixRepetitionSettings(), 1000, seed=0)
    prompts = [s.turns[0].prompt or "" for s in sessions]
    assert set(Counter(p[:1024] for p in prompts).values()) == {100}
    assert all(len(p) == 2048 for p in prompts)
    assert {s.turns[0].max_tokens for s in sessions} == {128}


@pytest.mark.parametrize("tokens", [0, 1, 2, 7, 64, 513, 2048])
def test_random_text_has_exactly_four_chars_per_token(tokens: int) -> None:
    for seed in range(20):
        assert len(random_text(rng_for(seed), tokens)) == 4 * tokens


def test_multiturn_synthetic_fallback_without_trace(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    missing = str(tmp_path / "absent.jsonl")
    opts = multiturn.MultiTurnSettings(trace=missing, synthetic_fallback=True)
    with caplog.at_level("WARNING", logger="prefix_router.lab.workloads.multiturn"):
        sessions = multiturn.build(opts, 30, seed=2)
    assert [r.levelname for r in caplog.records] == ["WARNING"]  # never silent: the figures differ
    assert missing in caplog.text and "synthetic" in caplog.text
    assert sum(len(s.turns) for s in sessions) == 30
    assert all(s.session_id.startswith("synthetic-") and len(s.turns) >= 1 for s in sessions)
    assert sessions == multiturn.build(opts, 30, seed=2)
    assert len({str(s.turns[0].messages[0]["content"])[:40] for s in sessions}) == len(sessions)


def test_rag_document_lengths_span_the_range() -> None:
    opts = rag.RagSettings(documents=12, document_tokens=300, document_tokens_max=1200)
    sessions = rag.build(opts, 200, seed=4)
    lengths = {estimate_tokens(_user(s).split("</document>")[0]) for s in sessions}
    assert min(lengths) >= 300 and max(lengths) <= 1200 + 8
    assert max(lengths) - min(lengths) > 400
    with pytest.raises(ValueError):
        rag.build(rag.RagSettings(document_tokens=100, document_tokens_max=50), 1, seed=0)


def test_bursty_tenants_come_in_bursts_and_share_only_their_prompt() -> None:
    opts = bursty.BurstySettings(system_tokens=16, system_tokens_max=32, question_tokens_max=16)
    sessions = bursty.build(opts, 3000, seed=2)
    assert sum(len(s.turns) for s in sessions) == 3000
    assert all(s1.arrival_s <= s2.arrival_s for s1, s2 in itertools.pairwise(sessions))
    by_tenant: dict[str | None, set[str]] = {}
    for s in sessions:
        by_tenant.setdefault(s.tenant, set()).add(_system(s))
    assert len(by_tenant) == opts.tenants and all(len(p) == 1 for p in by_tenant.values())
    # bursts: per tenant, the busiest 10-second window holds far more sessions than the average one
    for tenant in ("tenant-0", "tenant-1"):
        times = [s.arrival_s for s in sessions if s.tenant == tenant]
        windows = Counter(int(t // 10) for t in times)
        mean = len(times) / (max(times) // 10 + 1)
        assert max(windows.values()) > 3 * mean
    conversations = [s for s in sessions if len(s.turns) > 1]
    assert 0.3 < len(conversations) / len(sessions) < 0.7
    assert all(t.think_time_s > 0 for s in conversations for t in s.turns[1:])


def _history(session: chatbots.Session) -> list[dict[str, object]]:
    return [*session.preamble, *session.turns[0].messages]


def test_multiturn_interleaved_rotates_live_conversations(sharegpt_file: Path) -> None:
    opts = multiturn.MultiTurnSettings(trace=str(sharegpt_file), shuffle=False, interleave=2)
    sessions = multiturn.build(opts, 100, seed=0)
    order = [s.session_id for s in sessions]
    assert order[:8] == ["sharegpt-c0/turn-0", "sharegpt-c1/turn-0", "sharegpt-c0/turn-1",
                         "sharegpt-c1/turn-1", "sharegpt-c0/turn-2", "sharegpt-c1/turn-2",
                         "sharegpt-c2/turn-0", "sharegpt-c1/turn-3"]  # fmt: skip
    assert len(sessions) == 21 and all(len(s.turns) == 1 for s in sessions)
    assert len(multiturn.build(opts, 9, seed=0)) == 9


def test_multiturn_interleaved_history_is_the_previous_request_and_its_recorded_reply(
    sharegpt_file: Path,
) -> None:
    opts = multiturn.MultiTurnSettings(trace=str(sharegpt_file), shuffle=False, interleave=3,
                                       history_reply_tokens=10)  # fmt: skip
    by_id = {s.session_id: s for s in multiturn.build(opts, 100, seed=0)}
    first, second = by_id["sharegpt-c1/turn-0"], by_id["sharegpt-c1/turn-1"]
    assert second.preamble == (*_history(first), {"role": "assistant", "content": ("answer " * 20)[:40]})
    assert first.preamble == ({"role": "system", "content": opts.system_prompt},)
    assert str(second.turns[0].messages[0]["content"]).startswith("conv 1 question 1")


def test_multiturn_interleaved_more_slots_than_conversations(sharegpt_file: Path) -> None:
    opts = multiturn.MultiTurnSettings(trace=str(sharegpt_file), shuffle=False, interleave=50)
    sessions = multiturn.build(opts, 100, seed=0)
    assert [s.session_id for s in sessions[:6]] == [f"sharegpt-c{c}/turn-0" for c in range(6)]
    assert len(sessions) == 21


def test_multiturn_min_turns_skips_short_conversations(sharegpt_file: Path) -> None:
    for interleave in (0, 2):
        opts = multiturn.MultiTurnSettings(trace=str(sharegpt_file), shuffle=False, min_turns=4,
                                           interleave=interleave)  # fmt: skip
        ids = {s.session_id.partition("/turn-")[0] for s in multiturn.build(opts, 100, seed=0)}
        assert ids == {"sharegpt-c1", "sharegpt-c3", "sharegpt-c5"}
