"""KRATOS profiling runner: runs a workload under Nsight Compute and summarises the bottleneck.

Standard library only, Python 3.8+: it runs inside the Nsight Compute image.
"""
