"""The benchmark and soak harness of the gateway; bench/README.md lists its modules.

``python -m bench.run --quick`` measures cases A..Z on loopback (table, JSON, Markdown);
``python -m bench.soak`` runs the shipped gateway under a mixed load for minutes.
"""
