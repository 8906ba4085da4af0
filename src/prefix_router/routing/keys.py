"""Routing keys: a request's prompt as the engine will cache it, cut into chained block hashes.

Two keys, per model (``routing.keys.mode`` names what they read):

- Default (``routing/canonical.py``; modes ``characters`` and ``tokenizer``): chat requests become a
  canonical text in the order chat templates render them (first system message, tools with the client's
  key order, documents, the other messages; reasoning only where templates keep it). Blocks are
  ``block_chars`` UTF-8 bytes, or ``block_tokens`` token ids of a local ``tokenizer.json`` (mode
  ``tokenizer``). An image is valued at ``image_tokens`` (``image_tokens x chars_per_token`` key bytes).
- Exact (``routing/template.py``; mode ``template``, or ``events``, for the models in ``templates``): the
  model's own chat template and tokenizer render and tokenize the request; blocks are ``block_tokens``
  ids, the engine's page size. A request the template refuses, or one bringing its own
  ``chat_template``, falls back to the default key.

Completions use the prompt string, or token ids hashed as ids; a batch routes by its first prompt. The first
block is seeded with a namespace (model, LoRA adapter, ``cache_salt``, the digest of prompt options that
change the text at no fixed point, and the tenant when tenants are isolated), so requests of different
namespaces never share blocks. Fields that do not change the prompt (sampling, ``stream``, ``n``, ``user``,
``max_tokens``, ...) are never read.

Extension by the generated reply: the prompt extended with the reply as the next turn will carry it. A
reply that carried reasoning extends nothing (templates drop reasoning from earlier turns, so the next turn
diverges where the reply began); in exact mode the extension stops before the end-of-turn token (never
computed by the engine) and only when the next turn renders the prompt unchanged.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import re
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import prefix_router.routing.canonical as canonical
from prefix_router.protocol import Endpoint
from prefix_router.routing.canonical import MEDIA, as_dict, chat_text, has_reasoning
from prefix_router.routing.hashing import chain_blocks, hash_bytes, namespace_seed
from prefix_router.routing.precise import precise_chain, precise_seed
from prefix_router.routing.settings import KeySettings
from prefix_router.routing.template import ChatTemplate, TemplateError, load_templates, media_ids
from prefix_router.routing.types import InvalidRequest, RouteRequest
from prefix_router.routing.units import count_marks

__all__ = ["Endpoint", "InvalidRequest", "KeyBuilder", "chat_text"]

log = logging.getLogger(__name__)
# the key prefix ``hash_key`` hashes (``consistent_hash``'s ring position): 512 bytes, a system prompt's
# opening, long enough to tell applications apart and short enough that their users' texts share it
HASH_PREFIX_CHARS = 512
_MEDIA_RE = re.compile(f"{MEDIA}([0-9a-f]{{16}}){MEDIA}")


# ---------------------------------------------------------------- validation helpers


def _require_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string", "model")
    return model


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None or isinstance(value, str):
        return value
    raise InvalidRequest(f"'{key}' must be a string", key)


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

    def __init__(
        self,
        cfg: KeySettings,
        tokenize: Callable[[str], list[int]] | None = None,
        templates: Mapping[str, ChatTemplate] | None = None,
    ) -> None:
        self.cfg = cfg
        self._tokenize = tokenize if tokenize is not None else _load_tokenizer(cfg.tokenizer)
        if templates is None:
            templates = load_templates(cfg.templates, cfg.image_tokens, cfg.tool_choice_none_drops_tools)
        self.templates = dict(templates)
        self._media_chars = max(17, round(cfg.image_tokens * cfg.chars_per_token))
        # precise mode's block size (set while some worker publishes KV events); None: no precise keys
        self.precise_block_tokens: int | None = None

    def tools_first(self, model: Any) -> bool:
        """Whether ``model``'s template writes something for tools before the system text
        (``keys.tools_before_system``; a model without a name: assumed so, sharing nothing)."""
        if not isinstance(model, str):
            return True
        name = model.lower()
        return any(fnmatch.fnmatchcase(name, pattern.lower()) for pattern in self.cfg.tools_before_system)

    def namespace(self, body: Mapping[str, Any], tenant: str | None, exact: bool = False) -> int:
        given = as_dict(body)
        model = _require_model(given)
        adapter = _opt_str(given, "lora_path") or _opt_str(given, "lora_adapter")
        salt = _opt_str(given, "cache_salt")
        options = canonical.prompt_options(
            given, canonical.UNRENDERED_OPTIONS if exact else canonical.PROMPT_OPTIONS
        )
        mode = "exact" if exact else None
        isolated = tenant if self.cfg.isolate_tenants else None
        return namespace_seed((model, adapter, salt, options, mode, isolated))

    # ------------------------------------------------------------ default mode

    def payload(
        self, endpoint: Endpoint, body: Mapping[str, Any], generated: Mapping[str, Any] | None
    ) -> bytes:
        """The bytes that are cut into blocks: UTF-8 text, or token ids as 4-byte integers."""
        if endpoint == "chat":
            more = canonical.reply_text(body, generated) if generated is not None else ""
            given = as_dict(body)
            tooled = given.get("tools") or given.get("functions")
            spaced, first = self._tokenize is not None, not tooled or self.tools_first(given.get("model"))
            return self._encode_text(chat_text(body, spaced_json=spaced, tools_first=first) + more)
        prompt = _first_prompt(body)
        tail = str(generated.get("text") or "") if generated is not None else ""
        if isinstance(prompt, str):
            return self._encode_text(prompt + tail)
        tail_ids = self._tokenize(tail) if (tail and self._tokenize) else []
        return _token_bytes([*prompt, *tail_ids])

    def _encode_text(self, text: str) -> bytes:
        if self._tokenize is not None:
            return _token_bytes(self._text_ids(text, self._tokenize))
        if MEDIA in text:
            text = _MEDIA_RE.sub(self._media_text, text)
        return text.encode("utf-8", "surrogatepass")

    def _media_text(self, match: re.Match[str]) -> str:
        """An image in character blocks: ``image_tokens x chars_per_token`` bytes, named by its hash."""
        return (MEDIA + match.group(1) + MEDIA * self._media_chars)[: self._media_chars]

    def _text_ids(self, text: str, tokenize: Callable[[str], list[int]]) -> list[int]:
        if MEDIA not in text:
            return tokenize(text)
        ids: list[int] = []
        pos = 0
        for match in _MEDIA_RE.finditer(text):
            ids += tokenize(text[pos : match.start()]) + media_ids(match.group(1), self.cfg.image_tokens)
            pos = match.end()
        return ids + tokenize(text[pos:])

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

    def _key_tokens(self, data: bytes, tokens_mode: bool) -> int:
        if tokens_mode:
            return len(data) // 4
        return math.ceil(len(data) / self.cfg.chars_per_token)

    # ------------------------------------------------------------ exact mode

    def template_for(self, endpoint: Endpoint, body: Mapping[str, Any]) -> ChatTemplate | None:
        """The model's chat template when exact mode applies to this request."""
        if not self.templates or body.get("chat_template") is not None:
            return None
        model = body.get("model")
        return self.templates.get(model) if isinstance(model, str) else None

    def _exact_ids(self, template: ChatTemplate, endpoint: Endpoint, body: Mapping[str, Any]) -> list[int]:
        if endpoint == "chat":
            return template.chat_ids(body)
        prompt = _first_prompt(body)
        return template.completion_ids(prompt) if isinstance(prompt, str) else prompt

    def _exact_request(
        self,
        ids: list[int],
        body: Mapping[str, Any],
        route_id: str,
        tenant: str | None,
        session: str | None,
        engine_salt: str | None = None,
    ) -> RouteRequest:
        seed = self.namespace(body, tenant, exact=True)
        data = _token_bytes(ids)
        full = len(ids) - len(ids) % self.cfg.block_tokens
        precise = self.precise_blocks(ids, body, tenant, engine_salt)
        return RouteRequest(
            route_id=route_id,
            blocks=self._blocks(data, True, seed),
            block_tokens=self.cfg.block_tokens,
            key_tokens=len(ids),
            hash_key=hash_bytes(data[:HASH_PREFIX_CHARS], seed),
            namespace=seed,
            session=session,
            output_tokens_hint=_max_tokens(body),
            tail=data[full * 4 :],
            exact=True,
            precise_blocks=precise,
            precise_tokens=len(ids) if precise else 0,
        )

    def precise_blocks(
        self, ids: Sequence[int], body: Mapping[str, Any], tenant: str | None, engine_salt: str | None = None
    ) -> tuple[int, ...]:
        """Precise mode's chain of ``ids`` (``routing/precise.py``): seeded by the model (a LoRA adapter's
        name is the model its requests name) and the cache salt only, as the engine shares its cache. With
        tenants isolated, only a salted request gets one (the engine shares unsalted blocks across tenants:
        routing on them would tell one tenant what another sent). ``engine_salt``: the salt the proxy gives
        the tenant's requests (``tenants.cache_salt``), before the client's own, as the engine sees it."""
        size = self.precise_block_tokens
        given = as_dict(body)
        salt = _opt_str(given, "cache_salt")
        if engine_salt is not None:
            salt = f"{engine_salt}-{salt}" if salt else engine_salt
        if size is None or (self.cfg.isolate_tenants and tenant is not None and salt is None):
            return ()
        limit = self.cfg.max_prefix_chars
        if limit is not None:
            limit = int(limit / self.cfg.chars_per_token)
        return precise_chain(ids, size, precise_seed(_require_model(given), None, salt), limit)

    def _exact_extension(
        self, req: RouteRequest, endpoint: Endpoint, body: Mapping[str, Any], generated: Mapping[str, Any]
    ) -> tuple[int, ...]:
        """The prompt and the reply up to (not including) its end-of-turn token, when the next turn renders
        the prompt unchanged; otherwise the prompt alone."""
        ids = self._next_turn_ids(req, endpoint, body, generated)
        return req.blocks if ids is None else self._blocks(_token_bytes(ids), True, req.namespace)

    def _next_turn_ids(
        self, req: RouteRequest, endpoint: Endpoint, body: Mapping[str, Any], generated: Mapping[str, Any]
    ) -> list[int] | None:
        """The token ids of ``_exact_extension`` (None: the prompt alone)."""
        template = self.template_for(endpoint, body)
        bt = self.cfg.block_tokens
        if template is None or len(req.blocks) * bt < req.key_tokens - req.key_tokens % bt:
            return None  # no template, or a key cut by the prefix cap: nothing to add
        try:
            if endpoint == "chat":
                ids = template.chat_ids(body, reply=generated)
            else:
                prompt = _first_prompt(body)
                text = str(generated.get("text") or "")
                ids = template.completion_ids(prompt + text) if isinstance(prompt, str) else []
        except TemplateError:
            return None
        data = _token_bytes(ids)
        blocks = self._blocks(data, True, req.namespace)
        full = len(req.blocks)
        same_prompt = blocks[:full] == req.blocks and data[full * bt * 4 : req.key_tokens * 4] == req.tail
        if len(ids) <= req.key_tokens or not same_prompt:
            return None
        return ids[: _first(ids, template.eos_id, req.key_tokens)]

    def precise_extension(
        self,
        req: RouteRequest,
        endpoint: Endpoint,
        body: Mapping[str, Any],
        generated: Mapping[str, Any],
        *,
        tenant: str | None = None,
        engine_salt: str | None = None,
    ) -> tuple[int, ...]:
        """``extend``'s blocks in precise keys (``Outcome.precise_extension_blocks``): for an exact-mode
        request with a precise key whose next turn carries its reply; empty otherwise."""
        if not (req.exact and req.precise_blocks) or _stops(endpoint, body, generated):
            return ()
        ids = self._next_turn_ids(req, endpoint, body, generated)
        return () if ids is None else self.precise_blocks(ids, body, tenant, engine_salt)

    # ------------------------------------------------------------ requests

    def build(
        self,
        endpoint: Endpoint,
        body: Mapping[str, Any],
        *,
        route_id: str,
        tenant: str | None = None,
        session: str | None = None,
        engine_salt: str | None = None,
    ) -> RouteRequest:
        """Validate ``body`` and reduce it to a ``RouteRequest`` (raises ``InvalidRequest``);
        ``engine_salt``: the ``cache_salt`` the proxy adds for the engine (precise keys only)."""
        if not canonical.is_mapping(body):
            raise InvalidRequest("the request body must be a JSON object")
        template = self.template_for(endpoint, body)
        if template is not None:
            try:
                ids = self._exact_ids(template, endpoint, body)
            except TemplateError as exc:  # the engine will answer it; route it by the default key
                log.debug("exact key fell back for %s: %s", route_id, exc)
            else:
                return self._exact_request(ids, body, route_id, tenant, session, engine_salt)
        seed = self.namespace(body, tenant)
        data = self.payload(endpoint, body, None)
        tokens_mode = self._tokens_mode(endpoint, body)
        text = b"" if tokens_mode else data
        return RouteRequest(
            route_id=route_id,
            blocks=self._blocks(data, tokens_mode, seed),
            block_tokens=self.cfg.block_tokens,
            key_tokens=self._key_tokens(data, tokens_mode),
            hash_key=hash_bytes(data[:HASH_PREFIX_CHARS], seed),
            namespace=seed,
            session=session,
            output_tokens_hint=_max_tokens(body),
            tail=b"" if tokens_mode else data[len(data) - len(data) % self.cfg.block_chars :],
            text_model=None if tokens_mode else body["model"],  # validated by ``namespace``
            text=text,
            counts=count_marks(text),
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
        if _stops(endpoint, body, generated):
            return req.blocks
        if req.exact:
            return self._exact_extension(req, endpoint, body, generated)
        if self._tokenize is not None or self._tokens_mode(endpoint, body):
            return self.extension(endpoint, body, generated, tenant=tenant)
        if endpoint == "chat":
            more = canonical.reply_text(body, generated)
        else:
            more = str(generated.get("text") or "")
        data = req.tail + self._encode_text(more)
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
        if self.template_for(endpoint, body) is not None:
            req = self.build(endpoint, body, route_id="", tenant=tenant)
            if req.exact:
                return self.extend(req, endpoint, body, generated, tenant=tenant)
        seed = self.namespace(body, tenant)
        data = self.payload(endpoint, body, None if _stops(endpoint, body, generated) else generated)
        return self._blocks(data, self._tokens_mode(endpoint, body), seed)


def _stops(endpoint: Endpoint, body: Mapping[str, Any], generated: Mapping[str, Any]) -> bool:
    """Whether the reply adds nothing the next turn will share: it carried reasoning (templates drop it
    from earlier turns), or the prompt ended in a non-default way (no generation prompt, or a continued
    final message)."""
    if endpoint != "chat":
        return False
    return has_reasoning(generated) or bool(canonical.generation_text(body))


def _first(ids: Sequence[int], token: int | None, start: int) -> int:
    if token is None:
        return len(ids)
    try:
        return ids.index(token, start)
    except ValueError:
        return len(ids)


def _max_tokens(body: Mapping[str, Any]) -> int:
    given = as_dict(body)
    value = given.get("max_completion_tokens", given.get("max_tokens"))
    return value if type(value) is int and value > 0 else 0


def _load_tokenizer(path: str | None) -> Callable[[str], list[int]] | None:
    if path is None:
        return None
    from tokenizers import Tokenizer  # optional dependency, only with a configured tokenizer

    tokenizer = Tokenizer.from_file(path)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    return encode
