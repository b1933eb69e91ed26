"""benchmarks/input_pipeline.py's table 2 runs, tiny: ours with
train_crop_source 'center_square' and 'full_image' (made as train.py makes
them), the peer skipped."""

import argparse

from benchmarks import input_pipeline as bench
from input_pipeline import sources


def test_throughput_table_center_square_and_full_image(tmp_path):
  root = bench.make_image_folder(str(tmp_path), 16, 40)
  args = argparse.Namespace(image_size=32, warmup=1, workers=2,
                            torch_python=str(tmp_path / 'no_torch'),
                            full_image=True)
  lines = bench.throughput_table(args, root, batch=8, rounds=1, timed=1,
                                 preset='simclr', num_views=2, quick=True)
  text = '\n'.join(lines)
  assert 'batches [8, 32, 32, 3]' in text          # center_square.
  assert 'batches [8, 2, 32, 32, 3]' in text       # full_image: host crops.
  assert 'PEER SKIPPED' in text
  assert 'host alone, full_image / center_square' in text
  median = next(l for l in lines if l.strip().startswith('median')).split()
  # median, ours, full_image, the skipped peer, ours/peer (none), full/ours,
  # full/peer (none).
  assert len(median) == 7 and median[3:5] == ['skipped', '-']
  assert median[5].endswith('x') and median[6] == '-'


def test_ours_builds_as_train_does(tmp_path):
  root = bench.make_image_folder(str(tmp_path), 16, 40)
  ours = bench.Ours(root, batch=8, image_size=32, preset='simclr',
                    num_views=2, crop_source='full_image')
  assert ours.config.dataset.train_crop_source == 'full_image'
  assert isinstance(ours.fit, sources.RandomCrops)
  out = ours.augment_fn(1, ours.batches(1)['image'])
  assert out.shape == (8, 2, 32, 32, 3)
  square = bench.Ours(root, batch=8, image_size=32, preset='simclr',
                      num_views=2)
  assert square.fit is None and square.batch_shape == (8, 32, 32, 3)
