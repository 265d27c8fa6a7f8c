"""Profile the live engine on a workload (profiler.py) into a Trace (trace.py), and rank its ops (rank.py)."""
