#!/usr/bin/env bash
# The real upstream environments (plain vLLM and Dynamo on the CPU, the MiniLM model):
# the recipe ships inside the package, so that `extproc run` without --upstream can
# prepare its default upstream from an installed wheel too. Options and output:
# extproc/data/setup-real-upstream.sh.
exec bash "$(dirname "$0")/../extproc/data/setup-real-upstream.sh" "$@"
