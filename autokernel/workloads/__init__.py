"""Packaged workloads for `autokernel profile` (data only; the format is in autokernel/profile/workload.py)."""
