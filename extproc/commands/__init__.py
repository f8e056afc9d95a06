"""The command line: `extproc serve | run | check-config | health | presets` (``cli``),
the tools' commands (``probe``, ``learn``, ``shadow``, ``index_check``) and the options
they share (``options``). What they run is in :mod:`extproc.runtime` (`extproc serve`
itself is :mod:`extproc.runtime.serve_command`) and :mod:`extproc.tools`."""
