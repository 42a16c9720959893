"""The `lmq` command line: one entry point for serving, admin and benchmarks."""
