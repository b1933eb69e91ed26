#!/usr/bin/env bash
# `pip install -e .` into a fresh virtualenv gives a working package.
#
# The new venv sees the project's .venv (the pinned requirements) through a
# .pth file, and pip runs with --no-index: it installs only the project, and
# fails if a declared dependency's range excludes a pinned version (it cannot
# download anything to satisfy it). Then, from a directory outside the
# checkout: the three packages import from the checkout, a config file loads,
# `pip check` is clean, and the console scripts run (--helpfull; the study's
# outside a checkout says it needs one). About 30 s.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bash scripts/setup.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# .venv/bin/python -m venv makes a venv of the base interpreter, not of .venv.
.venv/bin/python -m venv "$tmp/venv"
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
purelib .venv/bin/python > "$(purelib "$tmp/venv/bin/python")/project_venv.pth"

cd "$tmp"
venv/bin/python -m pip install -q --disable-pip-version-check --no-index \
  --no-build-isolation -e "$root" 2>&1 \
  | { grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory.$" || true; }
venv/bin/python -m pip check --disable-pip-version-check

ROOT="$root" venv/bin/python - <<'EOF'
import importlib.metadata as md
import os

root = os.environ['ROOT']
assert os.path.realpath(os.getcwd()) != os.path.realpath(root)
import configs.default
import configs.papers.simclr
import contrastive_jax
import contrastive_jax.losses
import input_pipeline.augment
for module in (contrastive_jax, input_pipeline.augment, configs.default):
  where = os.path.realpath(module.__file__)
  assert where.startswith(os.path.realpath(root) + os.sep), where
assert configs.default.get_config().loss == 'ntxent'
assert 'ntxent' in contrastive_jax.losses.LOSSES
assert md.version('contrastive_jax') == contrastive_jax.__version__

want = {'contrastive-jax-train': 'contrastive_jax.cli:train',
        'contrastive-jax-eval': 'contrastive_jax.cli:evaluate'}
eps = {ep.name: ep for ep in md.entry_points(group='console_scripts')
       if ep.name.startswith('contrastive-jax')}
assert {n: ep.value for n, ep in eps.items()} == want, eps
bindir = os.path.dirname(os.sys.executable)
for name in want:
  path = os.path.join(bindir, name)
  assert os.access(path, os.X_OK), f'{path} is not an executable script'
for ep in eps.values():
  assert callable(ep.load()), ep
import subprocess
for name in ('contrastive-jax-train', 'contrastive-jax-eval'):
  out = subprocess.run([os.path.join(bindir, name), '--helpfull'],
                       capture_output=True, text=True, timeout=120)
  assert '--workdir' in out.stdout, out.stderr[-2000:]   # absl exits 1 on help.
print('console scripts run:', ', '.join(sorted(eps)))
print(f'install check passed: contrastive_jax {md.version("contrastive_jax")}'
      f' imported from {root}')
EOF
