"""The command line: `extproc serve | run | check-config | health | presets` (``cli``),
the tools' commands (``probe``, ``learn``, ``shadow``: `extproc probe | learn | shadow*`),
the options they share (``options``) and loading a contract with a readable error
(``contract_loading``); ``worker`` is one worker process of `extproc run --workers N`.
What they run is in :mod:`extproc.runtime` and :mod:`extproc.tools`."""
