"""Benchmarks of RedissonBroker against dramatiq's built-in RedisBroker.

Run ``python -m benchmarks --help``; see ``benchmarks/README.md``.
"""
