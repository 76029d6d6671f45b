"""Benchmarks: every baseline is a mode of the one engine, each run measured in its own processes.

spec (what one run is) -> runner (spawns worker processes, drives frames, aggregates) -> report/plots;
roofline places each phase against the machine's compute and bandwidth floors. The workloads (observations,
arrivals) and the run statistics (metrics) live here too: scripts/run.py drives the same frame loop.
"""
