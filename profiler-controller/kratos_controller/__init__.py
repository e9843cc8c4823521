"""The KRATOS profiler controller: finished profiling Jobs become WorkloadProfiles and execution Jobs."""
