"""The test harness: the real processes and analyses the suite and the benchmarks stand on.

* ``topology``: a local Redis Cluster, a Sentinel setup or a lone server, each a process of
  the embedded ``valkey-server`` on free loopback ports, stopped by pid (``Cluster``,
  ``Sentinel``, ``Server``); polling helpers ``wait_for`` / ``wait_until``.
* ``failover``: a worker and a producer through a failover of a Cluster or a Sentinel
  primary, and the windows that explain a second run (``run_failover``, ``fault_events``).
* ``tls_proxy``: TLS in front of the plain embedded server (it has no TLS), recording each
  connection's handshake and traffic.
* ``faults``: the fault-injection suite (``python -m tests.harness.faults``; see its README).

Its own small tests sit beside it (``test_*.py`` here and in ``faults/``): they check the
harness (a cluster comes up and fails over, a taken port is retried, the proxy forwards
and refuses, the analyses count what they should) rather than the broker. Run them with
``pytest tests/harness -m "not faults"`` (about a minute; the topology tests start real
clusters and sentinels).
"""
