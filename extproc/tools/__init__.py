"""Tools around the gateway that prove a migration: the offline probe, shadow mode and
`extproc learn`, built from what they share: ``toolkit`` (clients, corpus, the parity
and contract comparisons, report writing) and ``parity`` (answers compared, the
verdict model). A tool imports only its own package and those two. Their command
lines live in :mod:`extproc.commands` (``probe``, ``shadow``, ``learn``)."""
