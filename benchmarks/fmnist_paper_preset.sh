#!/usr/bin/env bash
# Fashion-MNIST: teacher, then DPSD at the paper preset in both modes (paper accounting, to reproduce the
# seed's setting) and at a sound epsilon of 1. Results under runs/bench/; summarise with
# `.venv/bin/python benchmarks/summarize.py runs/bench/*/report.json`.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin/dpdistill
out=runs/bench
mkdir -p "$out"
[ -f "$out/teacher/model.safetensors" ] || $bin train-teacher --dataset fmnist --out "$out/teacher" --epochs 5
run() {  # name, then transcribe options
  local name=$1; shift
  [ -f "$out/$name/report.json" ] && return
  if [ -d "$out/$name/resume" ]; then set -- "$@" --resume; fi
  /usr/bin/time -v $bin transcribe --teacher "$out/teacher" --out "$out/$name" "$@" 2> >(grep -E "Maximum resident" >&2)
}
run dpsd-data-paper  --privacy data  --preset paper --accounting paper --epsilon 10
run dpsd-label-paper --privacy label --preset paper --accounting paper --epsilon 1
run dpsd-data-sound1 --privacy data  --preset paper --epsilon 1
run dpsd-label-sound1 --privacy label --preset paper --epsilon 1
