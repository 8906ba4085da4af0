"""The endpoint picker in a pool with prefill workers: llm-d's convention, the decode worker as the
destination and ``x-prefiller-host-port`` naming the prefill worker for the decode pod's sidecar."""

from __future__ import annotations

from typing import Any

import orjson
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from prefix_router.epp import PickerStream
from prefix_router.epp.picker import PREFILLER_HEADER
from support.extproc import POST, body_message, destination_of, edge, headers_message, response_headers

PD_WORKERS = [
    {"name": "p", "url": "http://10.0.0.1:8000", "role": "prefill"},
    {"name": "d1", "url": "http://10.0.0.2:8000", "role": "decode"},
    {"name": "d2", "url": "http://10.0.0.3:8000", "role": "decode"},
]
LONG = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "a long shared prompt " * 60}]})


def set_headers(answer: Any) -> dict[str, str]:
    mutation = answer.request_headers.response.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


async def pick(stream: PickerStream, body: bytes) -> Any:
    await stream.answer(headers_message(POST))
    return (await stream.answer(body_message(body, end=True)))[0]


async def test_the_destination_is_a_decode_worker_and_the_prefill_goes_in_a_header() -> None:
    shared = edge(fallbacks=2, workers=PD_WORKERS)
    stream = PickerStream(shared)
    answer = await pick(stream, LONG)
    header, _ = destination_of(answer)
    endpoints = header.split(",")
    assert endpoints[0] in {"10.0.0.2:8000", "10.0.0.3:8000"} and "10.0.0.1:8000" not in endpoints
    assert set_headers(answer)[PREFILLER_HEADER] == "10.0.0.1:8000"
    state = shared.state
    assert state.pool.in_flight("p") == 1  # the prefill stage, dispatched
    decode = "d1" if endpoints[0] == "10.0.0.2:8000" else "d2"
    assert state.pool.in_flight(decode) == 1  # the decode, charged at the choice
    assert stream.pick is not None and stream.pick.flight.decision.predicted_tokens > 0  # handed over
    await stream.answer(response_headers(200))
    assert state.pool.in_flight("p") == 0  # done with the decode's first answer
    reply = orjson.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]})
    await stream.answer(ext.ProcessingRequest(response_body=ext.HttpBody(body=reply, end_of_stream=True)))
    stream.close()
    assert state.metrics.pd_requests.get(("split",)) == 1

    # the decode worker holds the prompt now: the decider skips the prefill, no header
    again = PickerStream(shared)
    answer = await pick(again, LONG)
    assert PREFILLER_HEADER not in set_headers(answer)
    assert destination_of(answer)[0].split(",")[0] == endpoints[0]
    again.close()
    assert state.metrics.pd_requests.get(("decode_holds_prefix",)) == 1 and state.pool.total_in_flight() == 0


async def test_a_pool_without_prefill_workers_sends_no_header() -> None:
    stream = PickerStream(edge())
    answer = await pick(stream, LONG)
    assert PREFILLER_HEADER not in set_headers(answer)
    stream.close()
