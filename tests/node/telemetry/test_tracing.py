"""The tracing switch (``telemetry.tracing``): off without an OTLP endpoint, the standard variables read
and checked at build time, the traceparent put on an upstream request once; the tenant's span tag."""

from __future__ import annotations

from typing import Any

import pytest

from prefix_router.node.config import load_config
from prefix_router.node.telemetry import otel, tracing
from prefix_router.node.telemetry.tracing import from_env, missing, with_traceparent
from prefix_router.proxy.run.app import create_app
from prefix_router.settings import ConfigError

ON = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
HTTP_TRACES = {
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/v1/traces",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
}


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "x"},  # no endpoint: off
        {**ON, "OTEL_SDK_DISABLED": "true"},
        {**ON, "OTEL_TRACES_EXPORTER": "none"},
    ],
)
def test_off_unless_an_endpoint_is_set_and_not_disabled(env: dict[str, str]) -> None:
    assert from_env(env) is None


@pytest.mark.parametrize(
    ("env", "word"),
    [
        ({**ON, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({**ON, "OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({**ON, "OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
        ({**ON, "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "_ARG"),
        ({**ON, "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"}, "_ARG"),
    ],
)
def test_a_bad_value_is_refused_when_the_node_is_built(
    env: dict[str, str], word: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match=word):
        from_env(env)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=word):
        create_app(load_config(env={}, overrides={"workers": []}))


@pytest.mark.parametrize(
    ("env", "protocol", "ratio"),
    [
        (ON, "grpc", None),
        (HTTP_TRACES, "http/protobuf", None),
        (
            {**ON, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": ".25"},
            "grpc",
            0.25,
        ),
    ],
)
def test_the_standard_variables_are_read(env: dict[str, str], protocol: str, ratio: float | None) -> None:
    make = from_env(env)
    assert make is not None
    assert tracing.protocol(env) == protocol and tracing.endpoint(env) is not None
    sampler: Any = otel.sampler(env)
    if ratio is not None:
        assert f"{ratio}" in sampler.get_description()
    else:
        assert sampler.get_description().startswith("ParentBased{root:AlwaysOnSampler")


def test_the_traces_endpoint_is_used_as_it_is_and_the_base_one_gets_the_path() -> None:
    base = otel.exporter("http://h:4318/", "http/protobuf", {})
    own = otel.exporter(
        "http://h:9/t", "http/protobuf", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:9/t"}
    )
    assert (base._endpoint, own._endpoint) == ("http://h:4318/v1/traces", "http://h:9/t")


def test_the_traceparent_replaces_the_clients_in_any_case() -> None:
    headers = {"TraceParent": "00-old", "tracestate": "k=v", "x": "y"}
    assert with_traceparent(headers, "00-new") == {"tracestate": "k=v", "x": "y", "traceparent": "00-new"}


def test_the_missing_extra_and_the_stale_protos_are_told_apart() -> None:
    assert "pip install 'prefix-router[otel]'" in missing(ImportError("No module named 'opentelemetry.sdk'"))
    stale = ImportError("cannot import name 'InstrumentationScope' from 'opentelemetry.proto.common.v1'")
    assert "scripts/otel-protos.sh" in missing(stale)


def test_a_tenant_is_tagged_by_a_hash_of_its_id_not_by_the_id() -> None:
    tag = otel.tenant_tag("a" * 32)
    assert len(tag) == 16 and tag == otel.tenant_tag("a" * 32) and tag not in "a" * 32
    assert tag != otel.tenant_tag("b" * 32)
