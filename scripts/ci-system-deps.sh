#!/usr/bin/env bash
# System (Debian) packages the test suite needs beyond the Python venv. Idempotent:
# does nothing when everything is already installed, so CI can call it on every run.
#
#   docker-compose   Debian's Compose (1.29): `docker-compose config -q` validates
#                    docker-compose.yml and its profiles (tests/test_deploy_artifacts.py);
#                    no Docker engine is needed for that.
#
# Needs root (CI runs as root) or sudo. Exit status non-zero if an install fails.
set -euo pipefail

PACKAGES=(docker-compose)

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

echo "ci-system-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q >&2
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
