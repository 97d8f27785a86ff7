"""The peer suite: Dramatiq's own test suite, run against :class:`dramatiq_redisson.RedissonBroker`.

Run it with ``python -m tests.peer`` (see ``docs/peer-suite.md``). The runner fetches the
sdist of the installed Dramatiq, extracts its ``tests/`` folder under ``.peer/`` and lays
the files below over it:

===========================  ======================================  ============================================
file here                    copied to                               role
===========================  ======================================  ============================================
``peer_conftest.py``         ``tests/conftest.py``                   fixtures, session server, deselection
``common.py``                ``tests/common.py``                     helpers the tests import (``worker``, skips)
``peer_broker.py``           ``tests/peer_broker.py``                RedissonBroker with StubBroker's test API
``deselected.json``          ``tests/peer_deselected.json``          deselected node ids and their reasons
``deselected_cluster.json``  ``tests/peer_deselected_cluster.json``  the same, for ``--cluster`` runs only
``peer.ini``                 ``pytest.ini``                          makes the extracted folder pytest's rootdir
===========================  ======================================  ============================================

``python -m tests.peer --cluster`` runs the same tests on a local Redis Cluster that the
runner starts (:class:`tests.harness.topology.Cluster`) and stops.

Nothing in this folder is collected by the project's own test run: no file here is
named ``test_*.py`` or ``conftest.py``.
"""
