"""Small synthetic image datasets for end-to-end tests (no TFDS needed)."""

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
