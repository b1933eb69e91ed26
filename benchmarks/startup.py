r"""What a run pays before its first step: imports and loading the data.

Run from the repository root:

    PYTHONPATH=. .venv/bin/python benchmarks/startup.py [--rounds=3]

Each figure is a fresh subprocess (nothing imported or cached in memory),
rounds alternated, medians printed; the machine is shared, so compare the
figures of one run with each other, never with another day's.

* imports: `import main; from contrastive_jax import train` (what main.py
  loads; no TensorFlow, see contrastive_jax/event_writer.py), against the
  same plus `import tensorflow`, which every run paid while clu's metric
  writers (which import it with their package) wrote the TensorBoard events.
* Fashion-MNIST's training split in memory (`sources.open_split`, 60k
  images): decoded record by record (the decoded file removed first) against
  read back from the decoded file (`TfdsSource.read_all`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

IMPORTS = 'import main; from contrastive_jax import train'
WITH_TF = IMPORTS + '; import tensorflow'
LOAD = """
import ml_collections, os, sys
from input_pipeline import sources
c = ml_collections.ConfigDict(dict(name='fashion_mnist', data_dir=None,
                                   image_size=None, in_memory=True))
path = sources.TfdsSource('fashion_mnist', 'train', data_dir=None,
                          image_size=None).decoded_path
if sys.argv[1] == 'decode' and os.path.exists(path):
  os.remove(path)
import time
t = time.perf_counter()
data = sources.open_split(c, 'train')
print(time.perf_counter() - t, len(data))
"""


def _seconds(code: str, *args: str) -> float:
  """Wall seconds of `python -c code` (or what it prints, if a number)."""
  t = time.perf_counter()
  out = subprocess.run([sys.executable, '-c', code, *args], cwd=ROOT,
                       capture_output=True, text=True, check=True,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
  wall = time.perf_counter() - t
  first = out.stdout.split()
  return float(first[0]) if first else wall


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--rounds', type=int, default=3)
  args = p.parse_args()
  _seconds(LOAD, 'read')          # Prepares the dataset and its decoded file.
  cases = {'imports (main.py)': (IMPORTS,),
           'imports + tensorflow (as with clu)': (WITH_TF,),
           'fashion_mnist train, decoded': (LOAD, 'decode'),
           'fashion_mnist train, decoded file read': (LOAD, 'read')}
  times = {k: [] for k in cases}
  for _ in range(args.rounds):
    for name, call in cases.items():
      times[name].append(_seconds(*call))
  print(f'load average {os.getloadavg()[0]:.1f}; medians of {args.rounds} '
        'alternated rounds, fresh processes:')
  for name, ts in times.items():
    print(f'  {name:40s} {statistics.median(ts):6.2f} s   '
          f'({", ".join(f"{t:.2f}" for t in ts)})')
  med = [statistics.median(v) for v in times.values()]
  print(f'  TensorFlow import avoided: {med[1] - med[0]:.2f} s per process; '
        f'decoded file vs decoding: {med[2] / med[3]:.0f}x faster')


if __name__ == '__main__':
  main()
