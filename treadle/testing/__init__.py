"""Real backing services started as local processes on 127.0.0.1, for tests and benchmarks.

Nothing here is a mock: each helper starts the real server binary (Debian ``redis-server``,
PyPI Mooncake's ``mooncake_master``) on a free loopback port and stops it on exit.
"""
