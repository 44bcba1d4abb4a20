"""Figures and verdicts from records: pure functions (latency, acceptance, statistics, SLOs,
identity, sampling tests, diagnosis, the probe and compare reports). No I/O, no servers, no
transport: everything here can be checked with records built in a test."""
