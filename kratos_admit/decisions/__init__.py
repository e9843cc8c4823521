"""The decisions, pure: validation, hints, profiling, ranking, calibration and the store interfaces they read; imports only the domain."""
