#!/usr/bin/env bash
# System (Debian) packages the test suite needs beyond the Python venv. Idempotent:
# does nothing when everything is already installed, so CI can call it on every run.
#
#   docker-compose   Debian's Compose (1.29): `docker-compose config -q` validates
#                    docker-compose.yml and its profiles (tests/test_deploy_artifacts.py);
#                    no Docker engine is needed for that.
#   prometheus       Debian's Prometheus (2.42) and promtool: `promtool check/test rules`
#                    on deploy/observability/prometheus/ and a Prometheus that
#                    tests/test_observability_live.py starts itself (127.0.0.1, a temp
#                    data dir). The package's own service must not run: the install is
#                    made with a policy-rc.d that forbids starting services (unless one
#                    is already there), and under systemd the unit is disabled.
#
# Needs root (CI runs as root) or sudo. Exit status non-zero if an install fails.
set -euo pipefail

PACKAGES=(docker-compose prometheus)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "ci-system-deps: already installed: ${PACKAGES[*]}" >&2
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "ci-system-deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi

# invoke-rc.d asks /usr/sbin/policy-rc.d before starting a service; 101 = not allowed.
POLICY_RC=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY_RC" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$POLICY_RC" >/dev/null
  "${SUDO[@]}" chmod 755 "$POLICY_RC"
  trap '"${SUDO[@]}" rm -f "$POLICY_RC"' EXIT
fi

echo "ci-system-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q >&2
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2

# Not started at boot either (only when this run installed it).
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  "${SUDO[@]}" systemctl disable prometheus.service >&2 || true
fi
