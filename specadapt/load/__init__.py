"""How requests are sent: the streaming HTTP client, arrival schedules, the load engine (closed
loop, open loop, duration, conversations), the jobs and their shares, and the executors that
run them in this process, in worker processes, in Ray actors or over several replicas, on one
clock. Every module here produces records; none computes a figure from them."""
