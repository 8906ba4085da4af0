"""Prefill/decode disaggregation at the simulated engine: the three flows' request fields, checked as
the engines check them, and the prefill's answer (simulated; no HTTP here).

- vLLM ``kv_transfer_params`` (NIXL-style; vllm-router, llm-d, production-stack): the prefill request has
  ``kv_transfer_params.do_remote_decode: true``; when it stops on its length cap (``max_tokens: 1``) its
  answer carries ``kv_transfer_params`` as vLLM's NIXL connector returns them (``do_remote_prefill: true``,
  ``do_remote_decode: false``, ``remote_block_ids``, ``remote_engine_id``, ``remote_request_id``,
  ``remote_host``, ``remote_port``, ``tp_size``). The decode request carries those back: the decode
  engine loads the prompt's first ``len(remote_block_ids)`` full blocks.
- Shared storage (vLLM's ``ExampleConnector``): no fields; a ``prefill`` engine saves its prompts' blocks
  to the shared ``KvStore``, a ``decode`` engine loads the longest stored prefix of its prompt.
- SGLang's bootstrap: ``bootstrap_host``, ``bootstrap_port``, ``bootstrap_room`` (a 63-bit integer) in
  the one body sent to both engines at once; the ``prefill`` engine computes the prompt (one token) and
  publishes the room; the ``decode`` engine waits for the room (``BOOTSTRAP_WAIT_S``), then loads.

A load costs the engine model's transfer time for the blocks it did not hold (``EngineModel.load``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefix_router.lab.sim.openai_api import ApiError, ApiRequest, Generation
from prefix_router.routing import Role

ROLES: tuple[Role, ...] = ("prefill", "decode", "both")
NIXL_SIDE_CHANNEL_PORT = 5600  # vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT default (nothing listens on it here)
BOOTSTRAP_WAIT_S = 30.0  # how long a decode engine waits for its room's prefill (model time)
MAX_ROOM = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Handoff:
    """What a request says about disaggregation (all empty: an ordinary request)."""

    remote_decode: bool = False  # a prefill whose KV another engine will pull
    remote_blocks: int | None = None  # a decode: the prefill's blocks to pull (len(remote_block_ids))
    room: int | None = None  # SGLang's bootstrap_room


def parse_handoff(body: Mapping[str, Any]) -> Handoff:
    """The disaggregation fields of a (valid JSON object) request body; raises ``ApiError``."""
    params = body.get("kv_transfer_params")
    remote_decode, remote_blocks = False, None
    if params is not None:
        if not isinstance(params, dict):
            raise ApiError("'kv_transfer_params' must be an object", "kv_transfer_params")
        remote_decode = params.get("do_remote_decode") is True
        if params.get("do_remote_prefill") is True:
            remote_blocks = _block_ids(params.get("remote_block_ids"))
    return Handoff(remote_decode, remote_blocks, _room(body))


def _block_ids(value: Any) -> int:
    if not isinstance(value, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in value):
        raise ApiError(
            "'kv_transfer_params.remote_block_ids' must be an array of integers", "kv_transfer_params"
        )
    return len(value)


def _room(body: Mapping[str, Any]) -> int | None:
    room = body.get("bootstrap_room")
    if room is None:
        return None
    if not isinstance(room, int) or isinstance(room, bool) or not 0 <= room <= MAX_ROOM:
        raise ApiError("'bootstrap_room' must be an integer in [0, 2**63)", "bootstrap_room")
    host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
    if not isinstance(host, str) or not host:
        raise ApiError("'bootstrap_host' must be a string with 'bootstrap_room'", "bootstrap_host")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65_536):
        raise ApiError("'bootstrap_port' must be a port number", "bootstrap_port")
    return room


def prefill_only(api: ApiRequest) -> ApiRequest:
    """``api`` cut to its first token: what an SGLang prefill engine computes (the decode generates)."""
    return dataclasses.replace(api, generations=tuple(_first_token(g) for g in api.generations))


def _first_token(generation: Generation) -> Generation:
    request = dataclasses.replace(generation.request, output_tokens=1, extension=())
    return dataclasses.replace(
        generation, request=request, output=generation.output[:1], finish_reason="length"
    )


def nixl_params(
    engine_id: str, response_id: str, blocks: int, host: str, port: int = NIXL_SIDE_CHANNEL_PORT
) -> dict[str, Any]:
    """The ``kv_transfer_params`` of a finished prefill, as vLLM's NIXL connector returns them: the
    prefill engine's block ids of the prompt's full blocks, where the decode pulls them from."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": list(range(blocks)),
        "remote_engine_id": engine_id,
        "remote_request_id": response_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
    }
