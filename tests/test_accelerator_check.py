"""The accelerator check's dry mode: the GPU script's code paths on the CPU.

benchmarks/accelerator.py runs on a GPU host now and then; this keeps it
working in between: the ResNet-50 step worker (built by step_lib.build from the
paper config, compiled, timed over the worker protocol, its cost analysis
read), the input-rate part and main.py streamed end to end, at tiny sizes. The PyTorch peer rows need
torch, which the project does not install: without it they are reported
absent, not failed.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_dry_run_reports_every_part(tmp_path):
  env = dict(os.environ, XLA_FLAGS='', PYTHONPATH=ROOT)
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'benchmarks', 'accelerator.py'),
       '--dry', '--parts=peak,r50,input,stream', f'--out={tmp_path}',
       f'--cache_dir={tmp_path / "cache"}', '--torch_python='],
      capture_output=True, text=True, env=env, check=False, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads((tmp_path / 'accelerator.json').read_text())
  assert report['dry'] and report['backend'] == 'cpu'
  r50 = report['r50']
  assert r50['peer_ready'] == 'no torch interpreter'
  ours = r50['ours']
  assert len(ours['step_ms_rounds']) == r50['spec']['rounds'] == 2
  # ResNet-50 at 32 px: the forward is 4.1 GMAC at 224 px scaled by
  # (32 / 224)^2, so forward + backward (3x) is ~0.5 GFLOP per view.
  assert 0.35e9 < r50['flops_per_image_fwd_bwd'] < 0.65e9
  assert ours['images_per_s'] > 0 and ours['step_ms'] > 0
  inp = report['input']['cells']['1']
  for row in ('ours_processes', 'ours_threads', 'ours_center_square'):
    assert inp[row][0]['images_per_s'] > 0, row
  assert 'worker processes' in inp['ours_processes'][0]['decoding']
  assert 'threads of the training process' in (
      inp['ours_threads'][0]['decoding'])
  assert 'no torch interpreter' in inp['peer_host_crops'][0]['error']
  assert set(report['input']['per_image']) == {
      f'{d} | {f}' for d in ('PIL, full size', 'PIL, reduced',
                             'libjpeg-turbo API, full size',
                             'libjpeg-turbo API, reduced (ours)')
      for f in ('center_square', 'full_image')}
  # main.py end to end, streamed and from memory, with the input wait.
  st = report['stream']
  for run in ('streamed', 'arrayrecord', 'memory'):
    assert st[run]['images_per_s'] > 0 and 0 <= st[run]['input_wait'] <= 1
    assert st[run]['intervals'], run
  assert 'image_folder' in st['streamed']['command']
  assert 'dataset.name=imagenet_like' in st['arrayrecord']['command']
  assert st['peer_error'] == 'no torch interpreter'
  assert 'stream  main.py ResNet-50 SimCLR' in proc.stdout
  assert 'r50     ours  batch 4' in proc.stdout
