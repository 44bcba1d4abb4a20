"""The client's self-report: the figures from raw inputs, the bottleneck verdict at its thresholds, and
the measuring context with an injected CPU clock and wall clock (nothing here depends on the machine)."""
import asyncio
import pytest
from specadapt.analysis.client_load import CPU_LIMIT, LAG_P99_LIMIT_MS, client_limited, client_load
from specadapt.load.meter import ClientMeter, measure_client
from specadapt.records import ClientLoad
from specadapt.analysis.client_load import client_limited, client_load
from specadapt.load import meter as client_load_mod

MS = 1_000_000


def load(lag_p99=None, cpu_fraction=0.5):
    return ClientLoad(wall_s=10.0, cpu_s=10.0 * cpu_fraction, cpu_fraction=cpu_fraction, loop_lag_ms_p99=lag_p99)


def test_thresholds_are_the_documented_ones():
    assert (LAG_P99_LIMIT_MS, CPU_LIMIT) == (5.0, 0.9)


@pytest.mark.parametrize("lag_p99, cpu, limited", [
    (None, 0.5, False), (0.0, 0.0, False), (5.0, 0.9, False),  # at the limits: not over them
    (5.001, 0.5, True), (4.999, 0.901, True), (50.0, 1.0, True),
])
def test_verdict_at_the_thresholds(lag_p99, cpu, limited):
    assert (client_limited(load(lag_p99, cpu)) is not None) is limited


def test_verdict_lines_are_exact():
    head = "the probe client was the bottleneck: "
    assert client_limited(load(7.25, 0.5)) == (
        head + "event-loop lag p99 7.2 ms (over 5 ms); its times are late: with CPU at 50% of a core it waited "
        "for a core: give the client cores of its own")
    assert client_limited(load(1.0, 0.955)) == (
        head + "CPU 96% of a core (over 90%); its times are late: run fewer streams per client process")
    assert client_limited(load(12.0, 0.95)) == (
        head + "event-loop lag p99 12.0 ms (over 5 ms) and CPU 95% of a core (over 90%); its times are late: "
        "run fewer streams per client process")
    # At exactly 90% of a core with lag: not busy, so the advice is about the cores.
    assert client_limited(load(6.0, 0.9)).endswith("with CPU at 90% of a core it waited for a core: "
                                                    "give the client cores of its own")


def test_figures_from_raw_inputs():
    got = client_load(wall_s=4.0, cpu_s=1.0, chunks=2000, lags_ns=[3 * MS, 1 * MS, 2 * MS, 0, 4 * MS])
    assert got.cpu_ms_per_chunk == 0.5 and got.cpu_fraction == 0.25 and got.chunks == 2000
    assert (got.loop_lag_ms_p50, got.loop_lag_ms_max, got.lag_samples) == (2.0, 4.0, 5)
    assert got.loop_lag_ms_p99 == pytest.approx(3.96)  # between 3 and 4 ms: linear interpolation of ranks
    assert (got.wall_s, got.cpu_s) == (4.0, 1.0)


def test_figures_without_chunks_time_or_samples():
    got = client_load(wall_s=0.0, cpu_s=0.2, chunks=0, lags_ns=[])
    assert got.cpu_ms_per_chunk is None and got.cpu_fraction == 0.0
    assert (got.loop_lag_ms_p50, got.loop_lag_ms_p99, got.loop_lag_ms_max, got.lag_samples) == (None, None, None, 0)
    one = client_load(wall_s=1.0, cpu_s=0.2, chunks=1, lags_ns=[MS])
    assert one.cpu_ms_per_chunk == 200.0 and one.loop_lag_ms_p99 == 1.0 and one.lag_samples == 1


class Stop(Exception):
    pass


def scripted_clock(readings):
    it = iter(readings)

    def clock():
        try:
            return next(it)
        except StopIteration:
            raise Stop from None
    return clock


def test_ticker_records_how_late_each_wake_up_is():
    # tick 1 ms: woke at +3 ms (2 ms late), at +1 ms (on time), at +0.5 ms (early reads count as 0).
    meter = ClientMeter(tick_s=0.001, clock=scripted_clock([0, 3 * MS, 10 * MS, 11 * MS, 20 * MS, 20 * MS + MS // 2]))
    with pytest.raises(Stop):
        asyncio.run(meter.tick())
    assert meter.lags_ns == [2 * MS, 0, 0]


class Counting:
    chunks_read = 10


def test_measure_client_counts_cpu_chunks_and_wall_time():
    now = [1_000 * MS]
    cpu = iter([2.0, 2.5])
    client = Counting()

    async def go():
        async with measure_client(client, tick_s=60, cpu=lambda: next(cpu), clock=lambda: now[0]) as meter:
            client.chunks_read += 90
            meter.add_chunks(2)
            meter.add_chunks(3)  # added up
            await asyncio.sleep(0)
            now[0] += 4_000 * MS
        return meter

    got = client_load(*asyncio.run(go()).figures)
    assert got.chunks == 95 and got.wall_s == 4.0 and got.cpu_s == 0.5
    assert got.cpu_fraction == 0.125 and got.cpu_ms_per_chunk == pytest.approx(500 / 95)
    assert got.lag_samples == 0


def test_measure_client_reports_also_when_the_run_raised():
    meters = []

    async def go():
        async with measure_client(tick_s=60, cpu=lambda: 1.0, clock=lambda: 0) as meter:
            meters.append(meter)
            raise RuntimeError("run failed")

    with pytest.raises(RuntimeError):
        asyncio.run(go())
    assert client_load(*meters[0].figures) is not None and client_load(*meters[0].figures).chunks == 0 and client_load(*meters[0].figures).cpu_s == 0.0


# Edges of the client's self-report figures: CPU share of runs shorter than a second, the ticker's
# lateness to the nanosecond with a long tick, and the record only set once the measured block ends.
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
