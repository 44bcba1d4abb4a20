"""Edges of the client's self-report figures: CPU share of runs shorter than a second, the ticker's
lateness to the nanosecond with a long tick, and the record only set once the measured block ends."""

import asyncio

import pytest

from specadapt.analysis.client_load import client_limited, client_load
from specadapt.load import meter as client_load_mod
from specadapt.load.meter import ClientMeter, measure_client

S = 1_000_000_000


def test_cpu_share_of_a_run_shorter_than_a_second():
    got = client_load(wall_s=0.5, cpu_s=0.475, chunks=19, lags_ns=[])
    assert got.cpu_fraction == pytest.approx(0.95) and got.cpu_ms_per_chunk == pytest.approx(25.0)
    assert client_limited(got) == ("the probe client was the bottleneck: CPU 95% of a core (over 90%); its times are "
                                   "late: run fewer streams per client process")


def test_ticker_lateness_is_exact_to_the_nanosecond_with_a_long_tick(monkeypatch):
    # tick 2 s (the sleeps return at once): woke 7 ns late, then 1 ns late, then on time
    readings = iter([0, 2 * S + 7, 10 * S, 12 * S + 1, 20 * S, 22 * S])

    class Stop(Exception):
        pass

    def clock():
        try:
            return next(readings)
        except StopIteration:
            raise Stop from None

    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(client_load_mod.asyncio, "sleep", sleep)
    meter = ClientMeter(tick_s=2.0, clock=clock)
    with pytest.raises(Stop):
        asyncio.run(meter.tick())
    assert meter.lags_ns == [7, 1, 0] and slept == [2.0, 2.0, 2.0]


def test_the_record_is_set_only_when_the_block_ends():
    async def go():
        async with measure_client(tick_s=60, cpu=lambda: 1.0, clock=lambda: 0) as meter:
            during = (client_load(*meter.figures) if meter.figures else None)
        return during, (client_load(*meter.figures) if meter.figures else None)

    during, after = asyncio.run(go())
    assert during is None and after is not None and after.chunks == 0
