#!/usr/bin/env bash
# System packages the test suite needs, installed only when missing (CI starts from nothing).
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian starts etcd as a service on install; the tests run their own on free ports.
  if [[ " ${need[*]} " == *" etcd-server "* ]]; then
    ($SUDO systemctl stop etcd 2>/dev/null || $SUDO service etcd stop 2>/dev/null || pkill -x etcd) || true
  fi
fi
