"""Tools around the gateway that prove a migration: the offline probe, shadow mode and
`extproc learn`, with what the probe and shadow mode share (``parity``). Their command
lines live in :mod:`extproc.commands` (``probe``, ``shadow``, ``learn``)."""
