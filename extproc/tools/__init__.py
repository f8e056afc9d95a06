"""Tools around the gateway that prove a migration, a package each: ``probe`` (the
offline parity probe), ``shadow`` (parity on live traffic), ``learn`` (the policy
written from a live legacy server) and ``index_check`` (whether the legacy index can
stay), built from what they share: ``toolkit`` (clients, corpus, the contract table,
report writing) and ``parity`` (answers read and compared, the verdict model). A tool
imports only its own package and those two. Their command lines live in
:mod:`extproc.commands`."""
