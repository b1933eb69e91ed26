"""contrastive_jax.load_encoder on a tiny trained run: the images it takes,
adapts and refuses (with the fix), its documentation and a quiet load."""

import json
import logging
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import contrastive_jax

from configs import test as test_config
from contrastive_jax import train
import synthetic_data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 12x12 grey images (synthetic_data): the run's image_shape is (12, 12, 1).
IMAGES = synthetic_data.stripes_and_brightness(6, 3).images


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  # configs/test.py for 4 steps of 32 images (checkpoints at 2 and 4), no
  # evaluation.
  config = test_config.get_config()
  config.num_epochs = 1.
  config.eval.baselines = False
  config.eval.embedding_points = 0
  for name in ('knn', 'linear', 'online_knn'):
    config.evals[name].every_steps = -1
  path = str(tmp_path_factory.mktemp('run'))
  train.train_and_evaluate(
      config, path, data=(synthetic_data.stripes_and_brightness(128, 0),
                          synthetic_data.stripes_and_brightness(32, 1)))
  return path


@pytest.fixture(scope='module')
def encoder(workdir):
  return contrastive_jax.load_encoder(workdir)


@pytest.fixture(scope='module')
def features(encoder):
  """The reference: the run's features of IMAGES, as uint8 pixels."""
  return encoder(IMAGES)


def test_the_run_image_shape_is_on_the_encoder(encoder, workdir):
  with open(os.path.join(workdir, 'data.json')) as f:
    stored = json.load(f)['image_shape']
  assert encoder.image_shape == tuple(stored) == IMAGES.shape[1:]
  assert encoder.step == 4


def test_integer_pixels_of_any_dtype_are_the_uint8_ones(encoder, features):
  assert features.shape == (6, 576) and IMAGES.dtype == np.uint8
  for dtype in (np.int64, np.int32, np.uint16):
    np.testing.assert_array_equal(encoder(IMAGES.astype(dtype)), features)
  # The same pixels as floats in [0, 1] (computed here): the same features
  # to float32 rounding.
  np.testing.assert_allclose(encoder(IMAGES / 255.), features, atol=1e-5)
  wide = IMAGES.astype(np.int64) * 256
  with pytest.raises(ValueError, match=re.escape(
      f'integer images must be pixels in [0, 255]; these span '
      f'[{wide.min()}, {wide.max()}]: pass uint8 pixels, or '
      'floats in [0, 1] (e.g. images / 65535 for 16-bit pixels).')):
    encoder(wide)


def test_floats_outside_0_1_are_refused_with_the_fix(encoder):
  top = IMAGES.max()
  with pytest.raises(ValueError, match=re.escape(
      f'float images must be in [0, 1]; these reach {top}: divide them by '
      '255 (images / 255).')):
    encoder(IMAGES.astype(np.float32))
  with pytest.raises(ValueError, match=r'these reach -1: .*\(images \+ 1\)'):
    encoder(IMAGES / 127.5 - 1.)
  with pytest.raises(ValueError, match='NaN or inf'):
    encoder(np.where(IMAGES > 100, np.nan, IMAGES / 255.))


def test_another_image_size_is_refused_naming_the_run_s(encoder):
  big = np.repeat(np.repeat(IMAGES, 2, axis=1), 2, axis=2)     # 24x24
  with pytest.raises(ValueError, match=re.escape(
      "images are 24x24; this encoder takes 12x12 ([B, 12, 12, 1], the "
      "run's image size): resize, e.g. jax.image.resize(images, "
      "(len(images), 12, 12, 1), 'linear') / 255.")):
    encoder(big)


def test_channels_first_is_refused_naming_the_transpose(encoder, features):
  nchw = IMAGES.transpose(0, 3, 1, 2)
  with pytest.raises(ValueError, match=re.escape(
      'images are [B, C, H, W] = [6, 1, 12, 12] (channels first); this '
      'encoder takes [B, 12, 12, 1]: images.transpose(0, 2, 3, 1).')):
    encoder(nchw)
  # The fix it names gives the run's features.
  np.testing.assert_array_equal(encoder(nchw.transpose(0, 2, 3, 1)), features)


def test_another_channel_count_is_refused_with_the_fix(encoder, features):
  rgb = np.repeat(IMAGES, 3, axis=-1)
  with pytest.raises(ValueError, match=re.escape(
      "images [6, 12, 12, 3] have 3 channels; this encoder takes 1 "
      "([B, 12, 12, 1], the run's images): RGB to grey: "
      "images[..., :3].mean(axis=-1, keepdims=True) / 255.")):
    encoder(rgb)
  np.testing.assert_allclose(
      encoder(rgb[..., :3].mean(axis=-1, keepdims=True) / 255), features,
      atol=1e-5)
  with pytest.raises(ValueError, match=re.escape(r'images[..., None]')):
    encoder(IMAGES[..., 0])


def test_one_image_is_a_batch_of_one(encoder):
  one = encoder(IMAGES[2])
  assert one.shape == (576,)
  np.testing.assert_array_equal(one, encoder(IMAGES[2:3])[0])
  np.testing.assert_array_equal(encoder.project(IMAGES[2]),
                                encoder.project(IMAGES[2:3])[0])
  with pytest.raises(ValueError, match=re.escape(
      'the image is [C, H, W] = [1, 24, 24] (channels first); this encoder '
      'takes [12, 12, 1]: image.transpose(1, 2, 0).')):
    encoder(np.zeros((1, 24, 24), np.uint8))


def test_help_describes_the_args_and_the_input_without_importing_jax():
  code = ('import pydoc, sys, contrastive_jax; '
          'print(pydoc.render_doc(contrastive_jax.load_encoder, '
          'renderer=pydoc.plaintext)); print("jax" in sys.modules)')
  out = subprocess.run([sys.executable, '-c', code], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  text, imported = out.stdout.rstrip().rsplit('\n', 1)
  assert imported == 'False'
  for words in ('`workdir`', '`step`', '`image_shape`', '[B, H, W, C]',
                'one image', 'uint8', 'floats lie in', 'channels first',
                'images.transpose(0, 2, 3, 1)', 'ValueError', '>>> '):
    assert words in text, words


def test_loading_logs_no_orbax_notice(workdir, caplog, capfd):
  caplog.set_level(logging.INFO)
  capfd.readouterr()
  encoder = contrastive_jax.load_encoder(workdir, step=2)
  assert encoder.step == 2
  err = capfd.readouterr().err
  orbax = [r.getMessage() for r in caplog.records
           if 'orbax' in r.pathname and r.levelno >= logging.WARNING]
  assert not orbax, orbax
  assert 'read only' not in err and 'read_only' not in err, err


def test_the_restore_s_own_warnings_still_show(workdir, tmp_path, caplog):
  # The newest checkpoint unreadable: the restore says so and reads step 2.
  copy = str(tmp_path / 'run')
  shutil.copytree(workdir, copy)
  step4 = os.path.join(copy, 'checkpoints', '4')
  assert os.path.isdir(step4)
  for folder, _, files in os.walk(step4):
    for f in files:
      if not f.endswith('.json') and 'metadata' not in f:
        with open(os.path.join(folder, f), 'wb') as out:
          out.write(b'not a checkpoint')
  caplog.set_level(logging.WARNING)
  assert contrastive_jax.load_encoder(copy).step == 2
  assert any('Checkpoint step 4' in r.getMessage() for r in caplog.records), (
      [r.getMessage() for r in caplog.records])
