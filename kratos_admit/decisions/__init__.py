"""The decisions, pure: validation, hints, profiling, holds, the policy and the store interfaces they read; imports the domain and the GPU model."""
