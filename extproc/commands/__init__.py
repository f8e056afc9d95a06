"""The command line: `extproc serve | run | check-config | health | presets` (``cli``),
the tools' commands (``probe``, ``learn``, ``shadow``: `extproc probe | learn | shadow*`),
the process launchers (``launcher`` for `extproc run`, ``shadow_launcher`` for
`extproc shadow`, ``workers``) and the rendering of the shipped Envoy configs."""
