#!/usr/bin/env bash
# Installs what the benchmark needs from Debian's packages: wrk (the load generator)
# and nginx + its njs module (the instant upstream). Idempotent: installs only what
# is missing and does nothing when all is there. Needs root (or sudo) for apt-get.
# The nginx package must not start a system nginx on port 80: while installing, a
# policy-rc.d that forbids service starts is put in place if there is none.
set -euo pipefail

need=()
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v nginx >/dev/null 2>&1 || need+=(nginx)
[ -f /usr/lib/nginx/modules/ngx_http_js_module.so ] || need+=(libnginx-mod-http-js)
if [ ${#need[@]} -eq 0 ]; then
  echo "bench/setup.sh: wrk, nginx and njs are installed"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
POLICY=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod +x "$POLICY"
  trap '$SUDO rm -f "$POLICY"' EXIT
fi

echo "bench/setup.sh: installing ${need[*]}"
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
  install -y -qq --no-install-recommends "${need[@]}"
command -v wrk >/dev/null && command -v nginx >/dev/null \
  && [ -f /usr/lib/nginx/modules/ngx_http_js_module.so ]
echo "bench/setup.sh: done ($(wrk -v 2>&1 | head -n1 | cut -c1-40); $(nginx -v 2>&1))"
