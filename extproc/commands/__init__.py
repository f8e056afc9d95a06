"""The command line: `extproc serve | run | check-config | health | presets`, the Envoy
process launcher and the rendering of the shipped Envoy configs."""
