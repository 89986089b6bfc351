"""Generate: run the target over prompt sets and store its outputs."""
