"""Driver scripts for the broker-core tests. Each runs the real C++ client of the
`rocketmq==0.4.4` wheel in its own process (its native threads must never live in the
pytest process) and prints one JSON object per line on stdout."""
