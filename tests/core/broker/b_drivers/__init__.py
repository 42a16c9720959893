"""Driver scripts for helper B's broker tests: each runs the real C++ client of the
`rocketmq==0.4.4` wheel in its own process and prints one JSON object per line."""
