"""Routing keys: a request's prompt as the engine will cache it, cut into chained block hashes.

Chat requests serialize ``tools``/``functions`` first (chat templates render them into the system part),
then every message in order: role, name, content (text; images and audio by a hash of their data or URL),
tool calls (name and arguments) and ``tool_call_id``. Serialization is message by message, so the key of
turn k of a conversation is an exact prefix of the key of turn k+1. Completions use the prompt string, or
token ids hashed as ids; a batch routes by its first prompt. The first block is seeded with a namespace
(model, LoRA adapter, ``cache_salt``, and the tenant when tenants are isolated), so requests of different
namespaces never share blocks. Blocks are ``block_chars`` UTF-8 bytes, or ``block_tokens`` token ids when
a local ``tokenizer.json`` is configured.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from prefix_router.protocol import Endpoint
from prefix_router.routing.hashing import chain_blocks, hash_bytes, namespace_seed
from prefix_router.routing.settings import KeySettings
from prefix_router.routing.types import RouteRequest

_US = "\x1f"  # field separator
_RS = "\x1e"  # message separator


class InvalidRequest(ValueError):
    """The body is not a valid request for its endpoint; the proxy answers 400 naming ``param``."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


# ---------------------------------------------------------------- validation helpers


def _require_model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string", "model")
    return model


def _opt_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None or isinstance(value, str):
        return value
    raise InvalidRequest(f"'{key}' must be a string", key)


def _digest(value: object) -> str:
    data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else orjson.dumps(value)
    return format(hash_bytes(data), "016x")


# ---------------------------------------------------------------- chat serialization


def _part_text(part: object, param: str) -> str:
    if not isinstance(part, Mapping):
        raise InvalidRequest("content parts must be objects", param)
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRequest("a text part needs a string 'text'", param)
        return text
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        return f"<image:{_digest(url)}>"
    if kind == "input_audio":
        audio = part.get("input_audio")
        data = audio.get("data") if isinstance(audio, Mapping) else audio
        return f"<audio:{_digest(data)}>"
    return f"<{kind}:{_digest(part)}>"


def _content_text(content: object, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(p, f"{param}[{i}]") for i, p in enumerate(content))
    raise InvalidRequest("'content' must be a string, an array of parts or null", param)


def _tool_calls_text(calls: object, param: str) -> str:
    if not calls:
        return ""
    if not isinstance(calls, list):
        raise InvalidRequest("'tool_calls' must be an array", param)
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            raise InvalidRequest("each tool call needs a 'function' object", param)
        out.append(f"{fn.get('name')}({fn.get('arguments')})")
    return ";".join(out)


def _message_text(msg: object, i: int) -> str:
    param = f"messages[{i}]"
    if not isinstance(msg, Mapping):
        raise InvalidRequest("each message must be an object", param)
    role = msg.get("role")
    if not isinstance(role, str):
        raise InvalidRequest("each message needs a string 'role'", f"{param}.role")
    name = msg.get("name")
    content = _content_text(msg.get("content"), f"{param}.content")
    calls = _tool_calls_text(msg.get("tool_calls"), f"{param}.tool_calls")
    call_id = msg.get("tool_call_id")
    fields = (role, name if isinstance(name, str) else "", content, calls, str(call_id or ""))
    return _US.join(fields) + _RS


def _tools_text(body: Mapping[str, Any]) -> str:
    tools = body.get("tools") or body.get("functions")
    if not tools:
        return ""
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array", "tools")
    return "".join(orjson.dumps(t, option=orjson.OPT_SORT_KEYS).decode() for t in tools) + _RS


def _messages(body: Mapping[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' is required and must be a non-empty array", "messages")
    return messages


def chat_text(body: Mapping[str, Any], extra: Sequence[Mapping[str, Any]] = ()) -> str:
    """The canonical text of a chat request (with ``extra`` messages appended)."""
    messages = [*_messages(body), *extra]
    return _tools_text(body) + "".join(_message_text(m, i) for i, m in enumerate(messages))


# ---------------------------------------------------------------- completions prompt


def _is_token_list(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def _first_prompt(body: Mapping[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if _is_token_list(prompt):
        return list(prompt)  # type: ignore[arg-type]
    if isinstance(prompt, list) and prompt and (isinstance(prompt[0], str) or _is_token_list(prompt[0])):
        return prompt[0]  # type: ignore[no-any-return]
    raise InvalidRequest(
        "'prompt' is required: a string, an array of strings, or an array of token ids", "prompt"
    )


def _token_bytes(ids: Sequence[int]) -> bytes:
    try:
        return array("I", ids).tobytes()  # refuses negative and too large ids
    except (OverflowError, TypeError):
        raise InvalidRequest("token ids must be integers in [0, 2^32)", "prompt") from None


# ---------------------------------------------------------------- the builder


class KeyBuilder:
    """Turns request bodies into ``RouteRequest``s under one key configuration (and optional tokenizer)."""

    def __init__(self, cfg: KeySettings, tokenize: Callable[[str], list[int]] | None = None) -> None:
        self.cfg = cfg
        self._tokenize = tokenize if tokenize is not None else _load_tokenizer(cfg.tokenizer_path)

    def namespace(self, body: Mapping[str, Any], tenant: str | None) -> int:
        model = _require_model(body)
        adapter = _opt_str(body, "lora_path") or _opt_str(body, "lora_adapter")
        salt = _opt_str(body, "cache_salt")
        return namespace_seed((model, adapter, salt, tenant if self.cfg.isolate_tenants else None))

    def payload(
        self, endpoint: Endpoint, body: Mapping[str, Any], generated: Mapping[str, Any] | None
    ) -> bytes:
        """The bytes that are cut into blocks: UTF-8 text, or token ids as 4-byte integers."""
        if endpoint == "chat":
            extra = [generated] if generated is not None else []
            return self._encode_text(chat_text(body, extra))
        prompt = _first_prompt(body)
        tail = str(generated.get("text") or "") if generated is not None else ""
        if isinstance(prompt, str):
            return self._encode_text(prompt + tail)
        tail_ids = self._tokenize(tail) if (tail and self._tokenize) else []
        return _token_bytes([*prompt, *tail_ids])

    def _encode_text(self, text: str) -> bytes:
        if self._tokenize is not None:
            return _token_bytes(self._tokenize(text))
        return text.encode("utf-8", "surrogatepass")

    def _block_bytes(self, tokens_mode: bool) -> int:
        return self.cfg.block_tokens * 4 if tokens_mode else self.cfg.block_chars

    def _tokens_mode(self, endpoint: Endpoint, body: Mapping[str, Any]) -> bool:
        """Blocks of token ids: with a tokenizer, or for a completions prompt given as ids (a cheap check;
        the prompt itself is validated once, in ``payload``)."""
        if self._tokenize is not None:
            return True
        if endpoint != "completions":
            return False
        prompt = body.get("prompt")
        first = prompt[0] if isinstance(prompt, list) and prompt else prompt
        return not isinstance(first, str)

    def _blocks(self, data: bytes, tokens_mode: bool, seed: int) -> tuple[int, ...]:
        size = self._block_bytes(tokens_mode)
        limit = self.cfg.max_prefix_chars
        if limit is not None and tokens_mode:
            limit = int(limit / self.cfg.chars_per_token) * 4
        return chain_blocks(data, size, seed, limit)

    def _prompt_tokens(self, data: bytes, tokens_mode: bool) -> int:
        if tokens_mode:
            return len(data) // 4
        return math.ceil(len(data) / self.cfg.chars_per_token)

    def build(
        self,
        endpoint: Endpoint,
        body: Mapping[str, Any],
        *,
        request_id: str,
        tenant: str | None = None,
        session: str | None = None,
    ) -> RouteRequest:
        """Validate ``body`` and reduce it to a ``RouteRequest`` (raises ``InvalidRequest``)."""
        if not isinstance(body, Mapping):
            raise InvalidRequest("the request body must be a JSON object")
        seed = self.namespace(body, tenant)
        data = self.payload(endpoint, body, None)
        tokens_mode = self._tokens_mode(endpoint, body)
        return RouteRequest(
            request_id=request_id,
            blocks=self._blocks(data, tokens_mode, seed),
            block_tokens=self.cfg.block_tokens,
            prompt_tokens=self._prompt_tokens(data, tokens_mode),
            hash_key=hash_bytes(data[: self.cfg.hash_prefix_chars], seed),
            namespace=seed,
            session=session,
            output_tokens_hint=_max_tokens(body),
            tail=b"" if tokens_mode else data[len(data) - len(data) % self.cfg.block_chars :],
        )

    def extend(
        self,
        req: RouteRequest,
        endpoint: Endpoint,
        body: Mapping[str, Any],
        generated: Mapping[str, Any],
        *,
        tenant: str | None = None,
    ) -> tuple[int, ...]:
        """``extension`` for a request built by ``build``, continuing its chain from its last block
        instead of rehashing the whole prompt (character blocks); equal results. Under the prefix cap: a
        truncated key leaves less than a block of room, so nothing is added."""
        if self._tokenize is not None or self._tokens_mode(endpoint, body):
            return self.extension(endpoint, body, generated, tenant=tenant)
        if endpoint == "chat":
            more = _message_text(generated, len(_messages(body)))
        else:
            more = str(generated.get("text") or "")
        data = req.tail + more.encode("utf-8", "surrogatepass")
        cap = self.cfg.max_prefix_chars
        room = None if cap is None else max(0, cap - len(req.blocks) * self.cfg.block_chars)
        seed = req.blocks[-1] if req.blocks else req.namespace
        return req.blocks + chain_blocks(data, self.cfg.block_chars, seed, room)

    def extension(
        self,
        endpoint: Endpoint,
        body: Mapping[str, Any],
        generated: Mapping[str, Any],
        *,
        tenant: str | None = None,
    ) -> tuple[int, ...]:
        """Blocks of the prompt extended with the generated output, as the next turn will carry it."""
        seed = self.namespace(body, tenant)
        data = self.payload(endpoint, body, generated)
        return self._blocks(data, self._tokens_mode(endpoint, body), seed)


def _max_tokens(body: Mapping[str, Any]) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if type(value) is int and value > 0 else 0


def _load_tokenizer(path: str | None) -> Callable[[str], list[int]] | None:
    if path is None:
        return None
    from tokenizers import Tokenizer  # optional dependency, only with a configured tokenizer

    tokenizer = Tokenizer.from_file(path)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    return encode
