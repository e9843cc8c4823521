"""The GPU model, pure: the catalog's figures per unit, ranking, calibration, exploration and the telemetry mapping; imports only the domain."""
