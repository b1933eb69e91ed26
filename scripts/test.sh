#!/usr/bin/env bash
# README command 2: the test suite (pytest, CPU, 8 virtual devices per worker).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
# pytest exits non-zero (5) when it collects no test, so an empty run fails.
exec .venv/bin/python -m pytest -n 2 --durations=10 "$@"
