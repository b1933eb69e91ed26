r"""Runs the notebooks and writes each `.ipynb` with its outputs.

    .venv/bin/python notebooks/execute.py            # all three, ~3 min on CPU
    .venv/bin/python notebooks/execute.py 01_losses  # one

The `.py` file (jupytext percent format) is the source a reviewer diffs; the
`.ipynb` is generated from it here, executed top to bottom in a fresh kernel
with notebooks/ as the working directory, and committed with its outputs so
it reads well on GitHub. The tests (tests/test_notebooks.py) execute the same
way and check what the cells computed.
"""

from __future__ import annotations

import os
import sys

import jupytext
import nbclient
import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
NOTEBOOKS = ('01_losses', '02_train', '03_checkpoint')
# 8 virtual CPU devices, as main.py's scripts use; a notebook sets nothing
# itself so that it runs unchanged on a GPU/TPU kernel.
ENV = {'XLA_FLAGS': '--xla_force_host_platform_device_count=8',
       'TF_CPP_MIN_LOG_LEVEL': '2', 'TF_ENABLE_ONEDNN_OPTS': '0'}


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
  for name in names or NOTEBOOKS:
    print(f'executing notebooks/{name}.py', flush=True)
    nb = execute(name)
    _as_displayed(nb)
    # Outputs kept; the pairing metadata lets `jupytext --sync` update either.
    jupytext.write(nb, os.path.join(HERE, name + '.ipynb'))
    print(f'  wrote notebooks/{name}.ipynb', flush=True)


if __name__ == '__main__':
  main(sys.argv[1:])
