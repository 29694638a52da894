"""The engine conformance suite: every queue verb (send, receive, ack, renew, release and
requeue, stats, fan-out, dead letters, attempts, payload types, the ORM), one module each
(``test_<verb>.py``), checked on one engine, gated by its ``EngineFeatures`` flags. Run it on
an engine of your own (``ENGINE`` takes any dotted path; ``docs/howto/test-your-engine.md``)::

    INSTALLED_APPS = [..., "spanner_queues", "spanner_queues.testing.conformance"]
    SPANNER_QUEUES = {"mine": {"ENGINE": "myproject.engines.MyEngine", "DATABASE": "default"}}

    pytest -p spanner_queues.testing.conformance.plugin --sq-conformance=mine --ds=mysettings

The app (label ``spanner_queues_conformance``) holds the suite's queues and their migration;
add it for the test run only. One module per verb; ``plugin`` is the entry point, ``support``
the helpers (``wait_until``, ``receive_due``), ``claimer`` a child process the concurrency test
starts. Importing this package imports nothing else.
"""
