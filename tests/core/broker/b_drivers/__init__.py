"""Driver scripts for the broker service tests (retry, DLQ, delay, locks, transactions):
each runs the real C++ client of the `rocketmq==0.4.4` wheel in its own process and prints one JSON object per line."""
