"""The command line: `extproc serve | run | check-config | health | presets` (``cli``),
the tools' commands (``probe``, ``learn``, ``shadow``: `extproc probe | learn | shadow*`),
the options they share (``options``) and loading a contract with a readable error
(``common``); ``shadow_launcher`` runs `extproc shadow`, ``worker`` is one worker
process of `extproc run --workers N`. What `extproc run` runs is in
:mod:`extproc.runtime`."""
