#!/usr/bin/env bash
# Idempotent set-up: a virtualenv with the pinned requirements in .venv, and
# Debian's Fashion-MNIST files (the offline source of the default dataset).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing the Debian package dataset-fashion-mnist..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist
  else
    echo "Note: dataset-fashion-mnist is not installed and this is not a root" \
         "shell with apt; Fashion-MNIST will be downloaded by TFDS instead" \
         "(needs network). To stay offline: sudo apt-get install" \
         "dataset-fashion-mnist" >&2
  fi
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Re-install only when requirements.txt changed since the last install.
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "Installing the pinned requirements into .venv (a few minutes, once)..."
  # This machine's pip configuration may name package-index folders that do
  # not exist; pip warns about each on every install. Only those lines are
  # dropped (grep); pip's exit status still decides (pipefail).
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt \
    2>&1 | { grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory.$" || true; }
  .venv/bin/pip check > /dev/null || { .venv/bin/pip check; exit 1; }
  echo "$want" > "$stamp"
fi
