"""The event-fed view: router keys recomputed from the events' token ids, removals through the engine
hash map, tiers, restarts, gaps, silence, speculative entries, bounds; held to a plain reference."""

from __future__ import annotations

import random

from hypothesis import example, given, settings
from hypothesis import strategies as st

from prefix_router.events import AllBlocksCleared, BlockRemoved, BlockStored
from prefix_router.routing.precise import (
    PreciseSettings,
    PreciseTuning,
    PreciseView,
    SeqVerdict,
    Staleness,
    precise_chain,
    precise_seed,
)

BS = 4
MODEL = "m"


def view(**knobs: object) -> PreciseView:
    v = PreciseView(PreciseSettings(block_tokens=BS), PreciseTuning(**knobs))  # type: ignore[arg-type]
    v.add_worker("a", MODEL)
    v.add_worker("b", MODEL)
    return v


def stored(hashes: list[int], tokens: list[int], parent: int | None = None, **more: object) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tuple(tokens), BS, **more)  # type: ignore[arg-type]


def keys(tokens: list[int], salt: str | None = None, model: str = MODEL) -> tuple[int, ...]:
    return precise_chain(tokens, BS, precise_seed(model, None, salt))


PROMPT = list(range(100, 114))  # 3 full blocks and 2 tokens


def test_request_keys_match_the_blocks_an_engine_stored_in_any_split() -> None:
    v = view()
    v.apply("a", [stored([901], PROMPT[:4]), stored([902, 903], PROMPT[4:12], parent=901)], 0.0)
    m = v.match(keys(PROMPT), 0.0)
    assert m.confirmed == {"a": 3} and m.steered == {"a": 3}
    assert v.match(keys([*PROMPT[:8], 7, 7, 7, 7]), 0.0).confirmed == {"a": 2}  # diverges in block 3


def test_salt_and_model_seed_the_chain() -> None:
    v = view()
    v.apply("a", [stored([1], PROMPT[:4], extra_keys=(("tenant-a",),))], 0.0)
    assert v.match(keys(PROMPT, "tenant-a"), 0.0).confirmed == {"a": 1}
    assert v.match(keys(PROMPT), 0.0).confirmed == {}
    assert v.match(keys(PROMPT, "tenant-a", model="other"), 0.0).confirmed == {}


def test_lora_blocks_match_requests_naming_the_adapter() -> None:
    v = view()
    event = stored([1, 2], PROMPT[:8], lora_name="ad", lora_id=1, extra_keys=(("ad",), ("ad",)))
    v.apply("a", [event], 0.0)
    assert v.match(keys(PROMPT, model="ad"), 0.0).confirmed == {"a": 2}
    assert v.match(keys(PROMPT), 0.0).confirmed == {}


def test_media_in_extra_keys_never_match_a_text_request() -> None:
    v = view()
    v.apply("a", [stored([1, 2], PROMPT[:8], extra_keys=(None, (("img", 0),)))], 0.0)
    assert v.match(keys(PROMPT), 0.0).confirmed == {"a": 1}


def test_removal_by_engine_hash_and_tiers() -> None:
    v = view()
    v.apply("a", [stored([1, 2], PROMPT[:8])], 0.0)
    v.apply("a", [stored([2], PROMPT[4:8], parent=1, medium="CPU")], 0.0)  # offloaded copy
    v.apply("a", [BlockRemoved((2,), "GPU")], 0.0)
    assert v.match(keys(PROMPT), 0.0).confirmed == {"a": 2}  # still on the CPU tier
    v.apply("a", [BlockRemoved((2,), "CPU"), BlockRemoved((77,))], 0.0)
    assert v.match(keys(PROMPT), 0.0).confirmed == {"a": 1}
    assert v.stats("a").unknown_removals == 1


def test_orphans_are_not_held() -> None:
    v = view()
    v.apply("a", [stored([5], PROMPT[4:8], parent=999)], 0.0)
    assert v.held_blocks("a") == 0 and v.stats("a").orphan_blocks == 1


def test_all_blocks_cleared_and_restart_forget_one_worker_only() -> None:
    v = view()
    for w in "ab":
        v.observe_seq(w, 0, 0.0)
        v.apply(w, [stored([1, 2], PROMPT[:8])], 0.0)
    v.apply("a", [AllBlocksCleared()], 0.0)
    assert v.match(keys(PROMPT), 0.0).confirmed == {"b": 2}
    assert v.observe_seq("b", 1, 0.0) == SeqVerdict.NEXT
    assert v.observe_seq("b", 0, 0.0) == SeqVerdict.RESTART  # a new process counts from 0 again
    assert v.match(keys(PROMPT), 0.0).confirmed == {}
    assert v.stats("b").restarts == 1 and v.stats("a").clears == 1


def test_a_reconnected_publisher_past_its_next_sequence_is_a_new_process() -> None:
    v = view()
    for w in "ab":
        v.observe_seq(w, 0, 0.0)
        v.apply(w, [stored([1, 2], PROMPT[:8])], 0.0)
    assert v.observe_seq("a", 1, 1.0, reconnected=True) == SeqVerdict.NEXT  # the same process: kept
    assert v.observe_seq("b", 40, 1.0) == SeqVerdict.GAP  # the same connection: messages lost
    assert v.match(keys(PROMPT), 1.0).confirmed == {"a": 2, "b": 2}
    # a new process, heard again only once its sequence passed the old one's last
    assert v.observe_seq("a", 9, 2.0, reconnected=True) == SeqVerdict.RESTART
    assert v.match(keys(PROMPT), 2.0).confirmed == {"b": 2}
    assert v.stats("a").restarts == 1 and v.stats("b").restarts == 0


def test_gap_marked_stale_then_fresh_again() -> None:
    v = view(stale_hold_s=5.0)
    v.observe_seq("a", 0, 0.0)
    v.apply("a", [stored([1], PROMPT[:4])], 0.0)
    assert v.observe_seq("a", 3, 1.0) == SeqVerdict.GAP
    v.mark_stale("a", 1.0)
    assert v.staleness("a", 2.0) == Staleness.GAP and "a" not in v.match(keys(PROMPT), 2.0).fresh
    assert v.fresh("a", 6.5) and v.match(keys(PROMPT), 6.5).confirmed == {"a": 1}
    assert v.observe_seq("a", 4, 7.0) == SeqVerdict.NEXT
    assert v.observe_seq("a", 9, 7.0) == SeqVerdict.GAP
    v.mark_stale("a", 7.0)
    v.apply("a", [AllBlocksCleared(), stored([1], PROMPT[:4])], 7.0)  # exact again: empty, then this
    assert v.fresh("a", 7.0) and v.match(keys(PROMPT), 7.0).confirmed == {"a": 1}


def test_silence_after_a_dispatch_that_should_store_blocks() -> None:
    v = view(silence_s=3.0)
    v.speculate("a", keys(PROMPT), 0, 10.0)
    assert v.fresh("a", 12.0) and not v.fresh("a", 13.5)
    assert v.staleness("a", 13.5) == Staleness.SILENT
    v.observe_seq("a", 0, 14.0)  # any message: publishing again
    assert v.fresh("a", 14.0)
    v.speculate("b", keys(PROMPT[:3]), 0, 10.0)  # no full block: nothing expected
    assert v.fresh("b", 100.0)


def test_wrong_block_size_is_stale_and_visible_once_the_engine_states_it() -> None:
    v = view()
    v.apply("a", [BlockStored((1,), None, tuple(range(16)), 16)], 0.0, engine_block=16)
    assert v.staleness("a", 0.0) == Staleness.BLOCK_SIZE
    assert v.summary("a", 0.0)["state"] == "block_size"


def test_a_block_size_the_engine_does_not_state_is_dropped_not_applied() -> None:
    v = view()
    v.apply("a", [stored([1], PROMPT[:4])], 0.0)
    for engine_block in (None, BS, 8):  # unknown, the configured one, a third one
        v.apply("a", [BlockStored((2,), 1, tuple(range(16)), 16)], 0.0, engine_block=engine_block)
    assert v.staleness("a", 0.0) == Staleness.FRESH and v.stats("a").block_size_mismatches == 3
    assert v.match(keys(PROMPT), 0.0).confirmed == {"a": 1} and v.mapped_hashes("a") == 1


def test_an_unconfirmed_restart_is_refused_and_the_stream_goes_on() -> None:
    """A sequence going back (a second publisher's ``seq 0``) without the engine confirming a restart:
    nothing cleared, the last sequence kept (the engine's next message is the next), the view stale."""
    v = view(stale_hold_s=5.0)
    v.observe_seq("a", 0, 0.0)
    v.apply("a", [stored([1, 2], PROMPT[:8])], 0.0)
    assert v.observe_seq("a", 1, 1.0) == SeqVerdict.NEXT
    assert v.observe_seq("a", 0, 2.0, confirmed=False) == SeqVerdict.REFUSED
    assert v.observe_seq("a", 40, 2.0, reconnected=True, confirmed=False) == SeqVerdict.REFUSED
    assert v.stats("a").refused_restarts == 2 and v.stats("a").restarts == 0
    assert v.summary("a", 2.0)["last_seq"] == 1 and v.staleness("a", 2.0) == Staleness.GAP
    assert v.observe_seq("a", 2, 3.0, confirmed=False) == SeqVerdict.NEXT
    assert v.match(keys(PROMPT), 8.0).confirmed == {"a": 2}
    assert v.observe_seq("a", 0, 9.0, confirmed=True) == SeqVerdict.RESTART
    assert v.match(keys(PROMPT), 9.0).confirmed == {}


def test_a_refused_restart_does_not_rearm_the_silence_clock() -> None:
    v = view(silence_s=3.0, stale_hold_s=0.5)
    v.observe_seq("a", 5, 0.0)
    v.speculate("a", keys(PROMPT), 0, 10.0)
    v.observe_seq("a", 0, 12.0, confirmed=False)
    assert v.staleness("a", 13.5) == Staleness.SILENT


def test_dispatches_do_not_rearm_the_silence_clock() -> None:
    """An engine that never publishes goes stale although requests keep going to it."""
    v = view(silence_s=3.0)
    for now in (10.0, 11.0, 12.0, 13.0):
        v.speculate("a", keys([*PROMPT, int(now)]), 0, now)
    assert v.staleness("a", 13.5) == Staleness.SILENT


def test_a_block_hash_reused_for_other_tokens_releases_the_old_key() -> None:
    v = view()
    v.apply("a", [stored([1], PROMPT[:4])], 0.0)
    v.apply("a", [stored([1], [7, 7, 7, 7])], 0.0)  # the engine's hash 1 now names other tokens
    assert v.match(keys(PROMPT), 0.0).confirmed == {}
    assert v.match(keys([7, 7, 7, 7]), 0.0).confirmed == {"a": 1}
    assert v.held_blocks("a") == 1 and v.mapped_hashes("a") == 1
    v.apply("a", [BlockRemoved((1,))], 0.0)
    assert v.held_blocks("a") == 0 and v.match(keys([7, 7, 7, 7]), 0.0).confirmed == {}


def test_a_worker_added_after_a_removal_does_not_inherit_blocks() -> None:
    v = view()
    v.add_worker("c", MODEL)
    v.apply("a", [stored([1, 2], PROMPT[:8])], 0.0)
    v.apply("c", [stored([1], PROMPT[:4])], 0.0)
    v.remove_worker("a")  # its bit is free again
    v.add_worker("d", MODEL)  # takes it
    m = v.match(keys(PROMPT), 0.0)
    assert m.confirmed == {"c": 1} and v.held_blocks("d") == 0


def test_replays_and_restored_sequences_are_kept_per_known_worker_and_unknown_ones_ignored() -> None:
    """``count_replay`` and ``restore_seq`` (the subscriber's, after a replay) act on a known worker only,
    and ``report`` counts agreement (within a block, above the report, above the prompt)."""
    v = view()
    v.add_worker("a", MODEL)
    v.count_replay("a")
    v.count_replay("gone")  # removed meanwhile: nothing, no error
    v.restore_seq("a", 41)
    v.restore_seq("gone", 7)
    v.report("a", 16, 16 + BS, 10)
    v.report("a", 40, 16, None)
    v.report("a", 20, 20, 20)  # the whole prompt, as reported: neither above
    v.report("gone", 1, 1, 1)
    stats = v.stats("a")
    assert stats.replays == 1 and v.summary("a", 0.0)["last_seq"] == 41
    assert (stats.reports, stats.within_block, stats.above_report, stats.above_prompt) == (3, 2, 1, 1)
    assert "gone" not in v


def test_speculative_entries_steer_expire_and_are_confirmed() -> None:
    v = view(speculative_ttl_s=2.0)
    blocks = keys(PROMPT)
    v.speculate("a", blocks, 0, 0.0)
    m = v.match(blocks, 1.0)
    assert m.steered == {"a": 3} and m.confirmed == {}
    v.apply("a", [stored([1], PROMPT[:4])], 1.0)
    assert v.stats("a").speculative_confirmed == 1 and v.speculative_blocks("a") == 2
    m = v.match(blocks, 2.5)
    assert m.steered == {"a": 1} and m.confirmed == {"a": 1}
    assert v.speculative_blocks("a") == 0 and v.stats("a").speculative_expired == 2


def test_bounds_hold() -> None:
    v = view(max_blocks_per_worker=10, max_speculative_per_worker=5)
    rng = random.Random(1)
    parent = None
    for i in range(40):
        tokens = [rng.randrange(1000) for _ in range(BS)]
        v.apply("a", [stored([i], tokens, parent)], 0.0)
        parent = i
        v.speculate("b", keys([rng.randrange(1000) for _ in range(BS * 3)]), 0, 0.0)
    assert v.mapped_hashes("a") == 10 and v.held_blocks("a") == 10
    assert v.stats("a").evicted_mappings == 30
    assert v.speculative_blocks("b") == 5


def test_last_homes_are_the_latest_removal_and_stay_bounded() -> None:
    v = view(max_homes=3)
    chain = keys(PROMPT)
    v.apply("a", [stored([1, 2, 3], PROMPT[:12])], 0.0)
    v.apply("b", [stored([7], PROMPT[:4])], 0.0)
    v.apply("a", [BlockRemoved((1, 2, 3))], 1.0)
    assert [v.home(k) for k in chain] == ["a", "a", "a"]
    v.apply("b", [BlockRemoved((7,))], 2.0)
    assert v.home(chain[0]) == "b"  # the latest removal wins
    others = [[rng_token + 500 + i * BS for rng_token in range(BS)] for i in range(5)]
    for i, tokens in enumerate(others):
        v.apply("a", [stored([100 + i], tokens)], 3.0)
        v.apply("a", [BlockRemoved((100 + i,))], 3.0)
    assert v.homes() == 3
    assert v.home(keys(others[-1])[0]) == "a" and v.home(chain[0]) is None  # the oldest went first


def test_a_home_that_turned_its_cache_over_since_is_no_home() -> None:
    v = view()
    v.apply("a", [stored([1], PROMPT[:4]), stored([2], [7, 7, 7, 7])], 0.0)
    v.apply("a", [BlockRemoved((1,))], 1.0)
    v.apply("a", [stored([3], [8, 8, 8, 8])], 2.0)  # 1 stored since, 2 held: its place is still there
    assert v.home(keys(PROMPT)[0]) == "a"
    v.apply("a", [stored([4], [9, 9, 9, 9]), BlockRemoved((2, 3))], 3.0)  # 2 stored since, 1 held
    assert v.home(keys(PROMPT)[0]) is None


def test_removed_worker_leaves_nothing_behind() -> None:
    v = view()
    v.apply("a", [stored([1], PROMPT[:4])], 0.0)
    v.speculate("a", keys(PROMPT), 1, 0.0)
    v.apply("b", [stored([2], PROMPT[:4]), BlockRemoved((2,))], 0.0)
    v.apply("a", [stored([3], PROMPT[4:8], parent=1), BlockRemoved((3,))], 0.0)
    v.remove_worker("a")
    v.add_worker("a", MODEL)
    assert v.match(keys(PROMPT), 0.0).steered == {}
    assert v.home(keys(PROMPT)[1]) is None and v.home(keys(PROMPT)[0]) == "b"


# ---------------------------------------------------------------- held to a plain reference


_worker, _media = st.sampled_from("ab"), st.sampled_from(["GPU", "CPU"])
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("store"), _worker, st.integers(0, 5), st.integers(1, 3), _media),
        st.tuples(st.just("remove"), _worker, st.integers(0, 5), st.integers(0, 3), _media),
        st.tuples(st.just("clear"), st.sampled_from("ab"), st.just(0), st.just(0), st.just("GPU")),
    ),
    max_size=40,
)  # fmt: skip


SEQ_BLOCKS = 6


@settings(max_examples=200, deadline=None)
@given(_ops, st.integers(0, 2**32 - 1))
# a store that reaches the sequence's end: its blocks stop at the last one (an event's token ids are
# block_size per block hash: the wire decoder refuses anything else)
@example([*[("store", "a", 0, 1, "GPU")] * 9, ("store", "a", 1, 3, "GPU"), ("store", "a", 3, 2, "GPU"),
          ("store", "a", 5, 2, "GPU")], 0)  # fmt: skip
def test_matches_a_plain_reference_of_held_prefixes(
    ops: list[tuple[str, str, int, int, str]], seed: int
) -> None:
    """Reference: per worker, the set of (prefix length, tiers) of one random token sequence per
    start; a request's confirmed match is its longest run of held leading prefixes."""
    rng = random.Random(seed)
    seqs = [[rng.randrange(50) for _ in range(BS * SEQ_BLOCKS)] for _ in range(2)]
    v = view(max_blocks_per_worker=10_000)
    ref: dict[str, dict[tuple[int, int], set[str]]] = {"a": {}, "b": {}}
    for op, worker, depth, count, medium in ops:
        s = depth % 2
        if op == "store":  # blocks depth..depth+count of sequence s, parent held or a chain's start
            start = depth if depth and (s, depth) in ref[worker] else 0
            count = min(count, SEQ_BLOCKS - start)
            hashes = [1000 * s + start + i + 1 for i in range(count)]
            parent = 1000 * s + start if start else None
            v.apply(
                worker,
                [stored(hashes, seqs[s][start * BS : (start + count) * BS], parent, medium=medium)],
                0.0,
            )
            for i in range(count):
                ref[worker].setdefault((s, start + i + 1), set()).add(medium)
        elif op == "remove":
            gone = tuple(1000 * s + depth + i + 1 for i in range(count))
            v.apply(worker, [BlockRemoved(gone, medium)], 0.0)
            for i in range(count):
                tiers = ref[worker].get((s, depth + i + 1))
                if tiers is not None:
                    tiers.discard(medium)
                    if not tiers:
                        del ref[worker][(s, depth + i + 1)]
        else:
            v.apply(worker, [AllBlocksCleared()], 0.0)
            ref[worker].clear()
    for s in range(2):
        expected = {}
        for worker in "ab":
            d = 0
            while (s, d + 1) in ref[worker]:
                d += 1
            if d:
                expected[worker] = d
        assert v.match(keys(seqs[s]), 0.0).confirmed == expected
