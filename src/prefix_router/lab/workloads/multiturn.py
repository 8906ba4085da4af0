"""Multi-turn conversations replayed from the ShareGPT subset (``../shared/traces``, never copied).

Each conversation is one session; user turn k is sent with the whole history (system preamble, earlier
user turns and the engine's *generated* replies) once the answer to turn k-1 has returned, so successive
turns share a growing prefix. The recorded reply only sizes ``max_tokens``. With ``synthetic_fallback``
(used by ``mixed``), a missing trace is replaced by synthetic conversations of random text
(session ids ``synthetic-N``) instead of an error, with a warning logged (the figures differ).

With ``interleave`` = K > 0, K conversations are live at once and their turns are sent in rotation (turn 1
of each, then turn 2 of each, ...; a conversation that ends hands its place to the next one): every
request is a one-turn session whose history is canned, the earlier user turns and the *recorded* replies
cut to ``history_reply_tokens``, so the order of the requests is the workload's, not the answers', and one
request in flight (``--concurrency 1``) still interleaves K conversations whose histories compete for the
engines' caches. ``think_time_s`` does not apply then.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Iterator
from typing import Any

import orjson

from prefix_router.lab.workloads.settings import WorkloadSettings
from prefix_router.lab.workloads.text import CHARS_PER_TOKEN, estimate_tokens, random_text, tagged_text
from prefix_router.lab.workloads.traces import SHAREGPT_FILE, find_trace
from prefix_router.lab.workloads.types import Session, Turn

log = logging.getLogger(__name__)


class MultiTurnSettings(WorkloadSettings):
    trace: str | None = None  # path of the ShareGPT-format JSONL; default: ../shared/traces
    max_turns: int = 8  # user turns kept per conversation
    min_turns: int = 1  # conversations with fewer user turns are skipped
    max_user_tokens: int = 256  # longer user messages are truncated (about 4 chars per token)
    min_output_tokens: int = 8
    max_output_tokens: int = 64  # max_tokens = recorded reply length, clamped to [min, max]
    think_time_s: float = 0.0
    system_prompt: str = "You are a helpful assistant."
    shuffle: bool = True  # pick conversations in a seeded random order (else file order)
    synthetic_fallback: bool = False  # without the trace, use synthetic conversations instead of failing
    interleave: int = 0  # K > 0: K live conversations, turns in rotation, canned history
    history_reply_tokens: int = 128  # interleaved: recorded replies cut to this


def build(opts: MultiTurnSettings, requests: int, seed: int) -> list[Session]:
    try:
        lines = find_trace(SHAREGPT_FILE, opts.trace).read_bytes().splitlines()
    except FileNotFoundError as missing:
        if not opts.synthetic_fallback:
            raise
        log.warning("%s: multi-turn conversations are synthetic (ids synthetic-N), not ShareGPT", missing)
        lines = synthetic_lines(requests // 2 + 1, seed)
    order = list(range(len(lines)))
    if opts.shuffle:
        random.Random(f"multiturn:{seed}").shuffle(order)
    if opts.interleave > 0:
        return interleaved(_conversations(lines, order, opts), opts.interleave, requests)
    return _take(_sessions(lines, order, opts), requests)


def synthetic_lines(count: int, seed: int) -> list[bytes]:
    """``count`` ShareGPT-shaped conversations of random text (2 to 6 user turns), ids ``synthetic-N``."""
    rng = random.Random(f"synthetic-conversations:{seed}")
    return [orjson.dumps({"id": f"synthetic-{i}", "conversations": _synthetic(i, rng)}) for i in range(count)]


def _synthetic(index: int, rng: random.Random) -> list[dict[str, str]]:
    messages = []
    for turn in range(rng.randint(2, 6)):
        user = tagged_text(f"conversation {index} turn {turn}", rng, rng.randint(10, 120))
        messages += [
            {"from": "human", "value": user},
            {"from": "gpt", "value": random_text(rng, rng.randint(20, 200))},
        ]
    return messages


def _sessions(lines: list[bytes], order: list[int], opts: MultiTurnSettings) -> Iterator[Session]:
    for index in order:
        record = orjson.loads(lines[index])
        turns = conversation_turns(record.get("conversations", []), opts)
        if len(turns) >= max(1, opts.min_turns):
            yield Session(
                session_id=_session_id(str(record.get("id", index))),
                arrival_s=0.0,
                turns=turns,
                preamble=({"role": "system", "content": opts.system_prompt},),
            )


def _conversations(
    lines: list[bytes], order: list[int], opts: MultiTurnSettings
) -> Iterator[Iterator[Session]]:
    """Per conversation (in ``order``), its turns as one-turn sessions carrying canned history."""
    for index in order:
        record = orjson.loads(lines[index])
        pairs = recorded_pairs(record.get("conversations", []), opts.max_turns)
        if len(pairs) >= max(1, opts.min_turns):
            yield _canned(_session_id(str(record.get("id", index))), pairs, opts)


def _canned(session_id: str, pairs: list[tuple[str, str]], opts: MultiTurnSettings) -> Iterator[Session]:
    """Turn k of a conversation as a session of one turn: the system preamble, then the user turns and the
    recorded replies (cut to ``history_reply_tokens``) before it, then turn k's user message."""
    history: list[dict[str, Any]] = [{"role": "system", "content": opts.system_prompt}]
    for k, (user, reply) in enumerate(pairs):
        turn = _turn(user, reply, opts, follow_up=False)
        yield Session(f"{session_id}/turn-{k}", 0.0, (turn,), preamble=tuple(history))
        canned = reply[: opts.history_reply_tokens * CHARS_PER_TOKEN] or "OK."
        history += [*turn.messages, {"role": "assistant", "content": canned}]


def interleaved(conversations: Iterator[Iterator[Session]], live: int, requests: int) -> list[Session]:
    """``requests`` sessions taken in rotation from ``live`` conversations at a time; a conversation that
    runs out of turns is replaced, in its place in the rotation, by the next one."""
    waiting = iter(conversations)
    rotation = deque(next(waiting, None) for _ in range(live))
    taken: list[Session] = []
    while rotation and len(taken) < requests:
        conversation = rotation.popleft()
        session = None if conversation is None else next(conversation, None)
        if session is None:
            fresh = next(waiting, None)
            if fresh is not None:
                rotation.appendleft(fresh)
            continue
        taken.append(session)
        rotation.append(conversation)
    return taken


def _session_id(record_id: str) -> str:
    return record_id if record_id.startswith("synthetic-") else f"sharegpt-{record_id}"


def _take(sessions: Iterator[Session], requests: int) -> list[Session]:
    """Whole sessions until ``requests`` turns are reached (the last one trimmed)."""
    taken: list[Session] = []
    left = requests
    for session in sessions:
        if left <= 0:
            break
        kept = session.turns[:left]
        taken.append(Session(session.session_id, 0.0, kept, preamble=session.preamble))
        left -= len(kept)
    return taken


def conversation_turns(conversation: list[dict[str, Any]], opts: MultiTurnSettings) -> tuple[Turn, ...]:
    """One turn per user message, sized by the reply that follows it."""
    pairs = recorded_pairs(conversation, opts.max_turns)
    return tuple(_turn(user, reply, opts, k > 0) for k, (user, reply) in enumerate(pairs))


def recorded_pairs(conversation: list[dict[str, Any]], max_turns: int) -> list[tuple[str, str]]:
    """The first ``max_turns`` user messages, each with the recorded reply that follows it ("" if none)."""
    pairs: list[tuple[str, str]] = []
    for i, message in enumerate(conversation):
        if message.get("from") != "human" or len(pairs) >= max_turns:
            continue
        reply = conversation[i + 1] if i + 1 < len(conversation) else {}
        pairs.append((str(message.get("value", "")), str(reply.get("value", ""))))
    return pairs


def _turn(user: str, reply: str, opts: MultiTurnSettings, follow_up: bool) -> Turn:
    content = user[: opts.max_user_tokens * CHARS_PER_TOKEN] or "Hello."
    out = min(opts.max_output_tokens, max(opts.min_output_tokens, estimate_tokens(reply)))
    think = opts.think_time_s if follow_up else 0.0
    return Turn(max_tokens=out, messages=({"role": "user", "content": content},), think_time_s=think)
