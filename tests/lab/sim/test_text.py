from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from prefix_router.lab.sim.text import (
    END,
    GENERATION_PROMPT,
    VOCAB_SIZE,
    generate_ids,
    ids_text,
    namespace_seed,
    render_chat,
    text_blocks,
    text_ids,
    text_pieces,
    token_count,
)


def test_about_four_characters_per_token() -> None:
    assert token_count("abcd") == 1
    assert token_count("abcde") == 2
    assert token_count("x" * 4000) == 1000


def test_each_generated_token_is_one_token_of_text() -> None:
    ids = generate_ids(7, 50)
    assert token_count(ids_text(ids)) == 50
    assert generate_ids(7, 50) == ids
    assert generate_ids(8, 50) != ids


def test_a_conversation_prompt_grows_by_prefix_across_turns() -> None:
    history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    first = render_chat(history)
    reply = ids_text(generate_ids(1, 30))
    second = render_chat(
        [*history, {"role": "assistant", "content": reply}, {"role": "user", "content": "go"}]
    )
    assert second.startswith(first + reply + END)


def test_tools_and_content_parts_are_rendered() -> None:
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]
    with_tools = render_chat([{"role": "user", "content": parts}], tools=[{"type": "function"}])
    other_image = render_chat(
        [{"role": "user", "content": [parts[0], {"type": "image_url", "image_url": {"url": "b"}}]}]
    )
    assert with_tools.startswith("<|tools|>")
    assert "look" in with_tools
    assert with_tools != other_image


@given(st.text(min_size=0, max_size=600), st.text(max_size=300))
def test_text_blocks_of_a_prefix_are_a_prefix(prefix: str, rest: str) -> None:
    seed = namespace_seed("m")
    short = text_blocks(prefix, 16, seed)
    long = text_blocks(prefix + rest, 16, seed)
    assert long[: len(short)] == short
    assert len(short) == len(prefix) // 64


def test_namespaces_do_not_share_blocks() -> None:
    text = "x" * 640
    assert text_blocks(text, 16, namespace_seed("a"))[0] != text_blocks(text, 16, namespace_seed("b"))[0]
    assert (
        text_blocks(text, 16, namespace_seed("a", "salt"))[0] != text_blocks(text, 16, namespace_seed("a"))[0]
    )


@given(st.text(max_size=400), st.text(max_size=200))
def test_token_ids_of_a_prefix_are_a_prefix(prefix: str, rest: str) -> None:
    short, long = text_ids(prefix), text_ids(prefix + rest)
    full = len(prefix) // 4
    assert long[:full] == short[:full]
    assert len(short) == token_count(prefix) == len(text_pieces(prefix))
    assert all(0 <= t < VOCAB_SIZE for t in long)


def test_token_ids_are_deterministic_and_tell_tokens_apart() -> None:
    assert text_ids("") == []
    assert text_ids("hello world") == text_ids("hello world")
    assert text_ids("abcd")[0] != text_ids("abce")[0]
    assert text_ids("ab") != text_ids("ab\x00")  # a short last token is not a NUL-padded one
    ids = text_ids("".join(f"{i:04d}" for i in range(2000)))
    assert len(set(ids)) > 1950  # 2,000 distinct tokens: ~16 collisions expected in a 128,256-id vocabulary
    assert text_ids("é€😀x") != text_ids("é€😀y")


def test_generation_prompt_and_open_final_message() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure: "}]
    closed = render_chat(messages)
    assert closed.endswith(END + GENERATION_PROMPT)
    assert render_chat(messages, add_generation_prompt=False) == closed.removesuffix(GENERATION_PROMPT)
    assert render_chat(messages, continue_final_message=True).endswith("Sure: ")
