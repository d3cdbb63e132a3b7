"""core/protect: protecting latency-critical guests: who is protected, the loop's decisions and cadence."""
