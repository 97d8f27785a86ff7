"""Fault-injection suite: real ``dramatiq`` CLI workers and a producer run against a
Valkey that the suite breaks on purpose, one fault at a time, while every run is recorded
on a second Valkey that no fault touches. See ``tests/harness/faults/README.md``.

Run ``python -m tests.harness.faults [SCENARIO ...|all] [--size small|full] [--json]``.
"""
