"""The load options of probe, compare and equiv: arrival rates, burstiness, duration, SLOs, and
how the load is spread (worker processes, Ray actors).

``load_options`` adds the options and hands the command one ``load`` argument, a
LoadSettings (None when none of them is given), and ``workers`` and ``ray_address`` as they
are. The schedules are seeded by the command's own ``--seed``.
"""

from __future__ import annotations

import functools

import click

from specadapt.analysis.slo import parse_slo
from specadapt.errors import UsageError
from specadapt.load.arrivals import parse_rates
from specadapt.records.load import LoadSettings


def build_load(request_rate: str | None, burstiness: float | None, duration: float | None, slo: str | None,
               seed: int) -> LoadSettings | None:
    """LoadSettings from the options' values, or None when none was given; UsageError on bad input."""
    rates = parse_rates(request_rate)
    slo_ms = parse_slo(slo)
    if burstiness is not None and not rates:
        raise UsageError("--burstiness shapes the gaps between arrivals: give --request-rate too")
    if not rates and duration is None and not slo_ms:
        return None
    return LoadSettings(request_rates=rates, burstiness=1.0 if burstiness is None else burstiness,
                        duration_s=duration, seed=seed, slo_ms=slo_ms)


show_option = click.option(
    "--show", type=click.IntRange(0), default=1, show_default=True,
    help="Answers drawn pass by pass in the reports, one per prompt (compare and equiv: the spec-on answers; "
         "0: none).")
"""--show N of probe, compare and equiv: one option, one meaning."""


def load_options(f):
    """Add --request-rate, --burstiness, --duration, --slo, --workers and --ray; pass ``load``
    (LoadSettings | None), ``workers`` and ``ray_address``."""

    @functools.wraps(f)
    def wrapper(*args, **kw):
        kw["load"] = build_load(kw.pop("request_rate"), kw.pop("burstiness"), kw.pop("duration"), kw.pop("slo"),
                                kw.get("seed") or 0)
        return f(*args, **kw)

    opts = [
        click.option("--request-rate", "request_rate", metavar="R[,R...]",
                     help="Open loop: send at R requests/s (Poisson; see --burstiness), e.g. 1,2,4,inf for a "
                          "sweep; inf sends all at once. Seeded by --seed."),
        click.option("--burstiness", type=click.FloatRange(0, min_open=True),
                     help="Gamma shape of the gaps between arrivals (mean 1/R): 1 is Poisson, below 1 burstier "
                          "[default: 1]."),
        click.option("--duration", type=click.FloatRange(0, min_open=True), metavar="SECONDS",
                     help="Send for this long, cycling through the prompts: at a request rate ceil(R * SECONDS) "
                          "arrivals; at a concurrency the streams are kept busy until the time is up."),
        click.option("--slo", metavar="METRIC=LIMIT[,...]",
                     help="Per-request objectives for goodput, e.g. ttft=200ms,tpot=40ms,itl=50ms,e2e=2s "
                          "(ms or s); see docs/probe.md."),
    ]
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return spread_options(wrapper)


def spread_options(f):
    """Add --workers and --ray (how the load is spread); the command gets ``workers`` and
    ``ray_address`` as they are (an empty --ray address is refused here, before any server)."""

    @functools.wraps(f)
    def wrapper(*args, **kw):
        address = kw.get("ray_address")
        if address is not None and not address.strip():
            raise UsageError("--ray needs an address: 'local', 'auto' or ray://host:port")
        return f(*args, **kw)

    opts = [
        click.option("--workers", type=click.IntRange(1, 512), default=1, show_default=True,
                     help="Worker processes (with --ray: Ray actors), each streaming its share of the requests at "
                          "its share of the concurrency (or of the arrivals)."),
        click.option("--ray", "ray_address", metavar="ADDRESS",
                     help="Run the workers as Ray actors spread over a cluster's nodes: 'local' (Ray on this "
                          "machine), 'auto' (the running cluster) or ray://host:port. Needs: "
                          "pip install 'specadapt[ray]'."),
    ]
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper
