"""Runs: probe, compare, sampling, tune and the demo, each callable as a library. A run starts or
connects to servers, sends its workload through ``specadapt.load``, reads the counters around it
and hands the records to ``specadapt.analysis`` for the report."""
