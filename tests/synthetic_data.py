"""Small synthetic image datasets for end-to-end tests (no TFDS needed)."""

import os

import numpy as np

from input_pipeline import pipeline


def stripes_and_brightness(n: int, seed: int) -> pipeline.ArrayDataset:
  """Four classes of 12x12 images; brightness and vertical stripes tell them.

  Class c has stripes when c is odd and is brighter when c >= 2, so a trained
  encoder separates the classes far above the 25% chance level.
  """
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 4, n).astype(np.int32)
  images = rng.random((n, 12, 12, 1)) * 0.3
  images[:, :, ::2] += (labels % 2)[:, None, None, None] * 0.5
  images += (labels // 2)[:, None, None, None] * 0.2
  return pipeline.ArrayDataset((np.clip(images, 0, 1) * 255).astype(np.uint8),
                               labels)


def make_jpeg_folder(root: str, num_train: int = 768, num_test: int = 256,
                     seed: int = 0) -> None:
  """root/{train,test}/class_c/*.jpg: 4 classes told by stripes and colour."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  for split, n in (('train', num_train), ('test', num_test)):
    labels = np.arange(n) % 4
    for i, c in enumerate(labels):
      # Faint cues under strong noise, so accuracies stay below 100% and a
      # wrong feature row would show.
      img = rng.random((20, 20, 3)) * 0.8
      if c % 2:
        img[:, ::3] += 0.15                  # vertical stripes
      img[..., c // 2] += 0.12               # red or green tint
      d = os.path.join(root, split, f'class_{c}')
      os.makedirs(d, exist_ok=True)
      Image.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8)).save(
          os.path.join(d, f'{i:05d}.jpg'), quality=90)


COLOURS = {'a': (220, 30, 30), 'b': (30, 220, 30), 'c': (30, 30, 220),
           'd': (220, 220, 30)}


def make_colour_folder(root: str, layout: dict[str, dict[str, int]],
                       seed: int = 0) -> None:
  """root/<split>/<class>/<i>.jpg, `layout[split][class]` images per class.

  Each class is one colour of `COLOURS` under mild noise, so raw pixels tell
  the classes apart (kNN near 100%) and a mislabelled class shows at once.
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  for split, classes in layout.items():
    for name, n in classes.items():
      d = os.path.join(root, split, name)
      os.makedirs(d, exist_ok=True)
      for i in range(n):
        img = np.array(COLOURS[name]) + rng.normal(0, 20, (20, 20, 3))
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
            os.path.join(d, f'{i:03d}.jpg'), quality=90)


def add_bad_files(class_dir: str) -> list[str]:
  """Writes the undecodable files a real folder holds into `class_dir`: text
  named .jpg, a JPEG cut in half and an empty .png. Returns their paths."""
  good = next(os.path.join(class_dir, f) for f in sorted(os.listdir(class_dir))
              if f.endswith('.jpg'))
  with open(good, 'rb') as f:
    jpeg = f.read()
  contents = {'zz_text.jpg': b'not an image\n',
              'zz_truncated.jpg': jpeg[:len(jpeg) // 2],
              'zz_empty.png': b''}
  paths = []
  for name, data in contents.items():
    paths.append(os.path.join(class_dir, name))
    with open(paths[-1], 'wb') as f:
      f.write(data)
  return paths


def main_argv(folder: str, workdir, *extra) -> list[str]:
  """main.py's argv for a run of seconds on a `make_jpeg_folder` folder:
  configs/test.py streaming the folder at 16 px through a 2-layer CNN, no
  baselines or online kNN, a 5-iteration probe; `extra` flags last."""
  import sys  # pylint: disable=g-import-not-at-top
  return [sys.executable, 'main.py', '--config=configs/test.py',
          f'--workdir={workdir}', '--config.dataset.name=image_folder',
          '--config.dataset.train_split=train',
          '--config.dataset.eval_split=test',
          f'--config.dataset.data_dir={folder}',
          '--config.dataset.image_size=16', '--config.dataset.in_memory=False',
          '--config.model.encoder_kwargs.widths=(4,8)',
          '--config.eval.baselines=False',
          '--config.evals.online_knn.every_steps=-1',
          '--config.evals.linear.max_iter=5', *extra]
