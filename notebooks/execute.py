r"""Regenerates the notebooks: runs each and writes its `.ipynb` with outputs.

    .venv/bin/python notebooks/execute.py            # all three, a few min on CPU
    .venv/bin/python notebooks/execute.py 01_losses  # one

The `.py` file (jupytext percent format) is the source a reviewer diffs; the
`.ipynb` is generated from it here, executed top to bottom in a fresh kernel
with notebooks/ as the working directory, and committed with its outputs so
it reads well on GitHub.

Staleness. Each written `.ipynb` records in its metadata
(`contrastive_jax.code_sha256`) a hash of the code that produced it: the
notebook's `.py`, the `.py` of the notebooks it reads the outputs of
(`03_checkpoint` restores the run of `02_train`), this file, and every `*.py`
under contrastive_jax/, input_pipeline/ and configs/. The tests
(tests/test_notebooks.py) recompute it without executing anything and fail
when the committed outputs came from other code: after any change there, run
this script and commit the notebooks it writes.

Checks. Each notebook runs with one extra cell that prints its main
variables; notebooks/checks.py checks them against independent values and
nothing is written unless they pass. The variables are recorded in the
metadata (`contrastive_jax.checked`), where the tests check them again.

`02_train` trains into `workdir/notebook/` (its default `WORKDIR`), which is
removed first when 02_train is run here, so that the run starts from step 0
with the current code rather than resuming an older checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import json

import jupytext
import nbclient
import nbformat

# checks.py beside this file; the library it checks against from the root.
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
import checks  # noqa: E402  (notebooks/checks.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NOTEBOOKS = ('01_losses', '02_train', '03_checkpoint')
# The notebooks whose outputs a notebook reads (the run it restores).
READS = {'03_checkpoint': ('02_train',)}
# The code every notebook runs; every *.py under these, recursively.
CODE_DIRS = ('contrastive_jax', 'input_pipeline', 'configs')
# The run 02_train writes and 03_checkpoint reads (their default WORKDIR).
WORKDIR = os.path.join(ROOT, 'workdir', 'notebook')
COMMAND = '.venv/bin/python notebooks/execute.py'
# 8 virtual CPU devices, as main.py's scripts use; a notebook sets nothing
# itself so that it runs unchanged on a GPU/TPU kernel.
ENV = {'XLA_FLAGS': '--xla_force_host_platform_device_count=8',
       'TF_CPP_MIN_LOG_LEVEL': '2', 'TF_ENABLE_ONEDNN_OPTS': '0'}


def code_files(name: str, root: str = ROOT) -> list[str]:
  """The files whose contents `code_hash(name)` covers, relative to the
  repository `root` with '/' separators, sorted."""
  files = {f'notebooks/{n}.py' for n in (name, *READS.get(name, ()))}
  files.add('notebooks/execute.py')
  for top in CODE_DIRS:
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
      dirnames[:] = [d for d in dirnames if not d.startswith(('.', '__'))]
      for f in filenames:
        if f.endswith('.py'):
          files.add(os.path.relpath(os.path.join(dirpath, f), root)
                    .replace(os.sep, '/'))
  return sorted(files)


def code_hash(name: str, root: str = ROOT) -> str:
  """SHA-256 over the sorted paths and contents of `code_files(name)`.

  Line endings are normalised to '\n', so a checkout that converts them
  (git's autocrlf) hashes the same.
  """
  h = hashlib.sha256()
  for path in code_files(name, root):
    with open(os.path.join(root, path), 'rb') as f:
      data = f.read().replace(b'\r\n', b'\n')
    for part in (path.encode(), str(len(data)).encode(), data):
      h.update(part + b'\0')
  return h.hexdigest()


def recorded_hash(nb: nbformat.NotebookNode) -> str | None:
  """The code hash a written notebook records, or None."""
  return nb.metadata.get('contrastive_jax', {}).get('code_sha256')


def untracked_code() -> list[str]:
  """Files `code_hash` covers that git does not track (a fresh clone, as CI
  checks out, lacks them, so its hash differs); [] without git."""
  try:
    out = subprocess.run(
        ['git', 'ls-files', '--others', '--exclude-standard', '--',
         *CODE_DIRS], cwd=ROOT, capture_output=True, text=True, check=True)
  except (OSError, subprocess.CalledProcessError):
    return []
  return [f for f in out.stdout.split() if f.endswith('.py')]


def execute(name: str, *, extra_cells: tuple[str, ...] = (),
            env: dict[str, str] | None = None,
            timeout: int = 900) -> nbformat.NotebookNode:
  """Executes notebooks/<name>.py (plus `extra_cells` appended), returns it.

  Raises nbclient's CellExecutionError, naming the cell, if any cell fails.
  """
  nb = jupytext.read(os.path.join(HERE, name + '.py'))
  for source in extra_cells:
    nb.cells.append(nbformat.v4.new_code_cell(source))
  saved = dict(os.environ)
  # The kernel inherits this process's environment.
  os.environ.update({k: os.environ.get(k, v) for k, v in ENV.items()})
  os.environ.update(env or {})
  try:
    nbclient.NotebookClient(
        nb, timeout=timeout, kernel_name='python3',
        # The kernel's own warning that local TCP traffic is unencrypted is
        # no news to a local run; its errors still show.
        extra_arguments=['--IPKernelApp.log_level=ERROR'],
        resources={'metadata': {'path': HERE}}).execute()
  finally:
    os.environ.clear()
    os.environ.update(saved)
  return nb


def recorded_variables(name: str) -> dict:
  """The checked variables the committed notebooks/<name>.ipynb records."""
  nb = nbformat.read(os.path.join(HERE, name + '.ipynb'), 4)
  return nb.metadata.get('contrastive_jax', {}).get('checked', {})


def execute_and_check(name: str, read: dict | None = None,
                      env: dict[str, str] | None = None):
  """Executes notebook `name` with its dump cell, removes that cell and runs
  its checks (`checks.CHECKS`) on the printed variables and on the run's
  workdir; returns (notebook, variables). `read`: the variables of the
  notebook it restores (checks.READS)."""
  nb = execute(name, extra_cells=(checks.dump_cell(name),), env=env)
  dump = nb.cells.pop()
  text = ''.join(o.get('text', '') for o in dump.outputs)
  variables = json.loads(text.split('JSON:', 1)[1])
  workdir = (env or {}).get('NOTEBOOK_WORKDIR') or os.environ.get(
      'NOTEBOOK_WORKDIR', WORKDIR)
  checks.CHECKS[name](nb, variables, workdir=workdir, read=read)
  return nb, variables


def _as_displayed(nb: nbformat.NotebookNode) -> None:
  """Stream outputs as Jupyter shows them: consecutive ones of a stream
  merged, each line only what follows its last carriage return (a progress
  bar's final state, not its every redraw). GitHub renders raw text."""
  for cell in nb.cells:
    merged = []
    for out in cell.get('outputs', []):
      if (out.output_type == 'stream' and merged and
          merged[-1].output_type == 'stream' and merged[-1].name == out.name):
        merged[-1].text += out.text
      else:
        merged.append(out)
    for out in merged:
      if out.output_type == 'stream':
        out.text = '\n'.join(line.rstrip('\r').split('\r')[-1].rstrip()
                             for line in out.text.split('\n'))
    if 'outputs' in cell:
      cell.outputs = merged


def main(names) -> None:
  names = list(names or NOTEBOOKS)
  unknown = sorted(set(names) - set(NOTEBOOKS))
  if unknown:
    raise SystemExit(f'unknown notebook(s) {unknown}; known: {NOTEBOOKS}')
  # In dependency order: a notebook runs after those whose outputs it reads.
  names.sort(key=NOTEBOOKS.index)
  if untracked := untracked_code():
    print(f'warning: {", ".join(untracked)} not tracked by git: the recorded '
          'hashes cover them, so commit them with the notebooks, or remove '
          'them and run this again.', flush=True)
  if '02_train' in names and 'NOTEBOOK_WORKDIR' not in os.environ:
    print(f'removing {os.path.relpath(WORKDIR)} (02_train trains from step 0)',
          flush=True)
    shutil.rmtree(WORKDIR, ignore_errors=True)
  done = {}
  for name in names:
    print(f'executing notebooks/{name}.py', flush=True)
    before = code_hash(name)
    reads = checks.READS.get(name)
    read = (done.get(reads) or recorded_variables(reads)) if reads else None
    try:
      nb, done[name] = execute_and_check(name, read)
    except AssertionError as e:
      raise SystemExit(f'notebooks/{name}.py ran but failed its check in '
                       f'notebooks/checks.py ({e!r}); nothing written.') from e
    if code_hash(name) != before:
      raise SystemExit(f'the code changed while notebooks/{name}.py ran; '
                       f'nothing written: run {COMMAND} {name} again.')
    _as_displayed(nb)
    nb.metadata['contrastive_jax'] = {'code_sha256': before,
                                      'checked': done[name]}
    # Outputs kept; the pairing metadata lets `jupytext --sync` update either.
    jupytext.write(nb, os.path.join(HERE, name + '.ipynb'))
    print(f'  wrote notebooks/{name}.ipynb', flush=True)


if __name__ == '__main__':
  main(sys.argv[1:])
