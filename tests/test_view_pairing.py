"""Which query and key views a key-encoder loss takes as positives.

`moco.positive_pairs` states each loss's pairing of query and key slots;
the method's validation uses it to refuse view orders that make a view its
own positive. The rules are checked here against the losses themselves.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import byol as byol_config
from configs import moco_v3 as moco_v3_config
from contrastive_jax import config_lib
from contrastive_jax import losses
from contrastive_jax.methods import byol
from contrastive_jax.methods import moco

D = 512   # Random unit vectors of this size are near-orthogonal (|cos| < 0.2).

RULES = {**moco.Method.pairing, **byol.Method.pairing}
SIMILARITY = {'infonce': 'pos_sim', 'cacr': 'pos_sim', 'jcl': 'pos_sim',
              'byol': 'cosine'}
KWARGS = {'infonce': {'in_batch_negatives': True}, 'cacr': {},
          'jcl': {'in_batch_negatives': True}, 'byol': {}}


def _views(query_views, key_views, n=8):
  """[N, Vq, D] queries and [N, Vk, D] keys: view id i of instance n is the
  same random vector wherever it appears, so a positive pair of one view
  has cosine 1 and any other pair about 0."""
  ids = max(query_views + key_views) + 1
  vecs = jax.random.normal(jax.random.key(0), (n, ids, D))
  return vecs[:, list(query_views)], vecs[:, list(key_views)]


def _shapes(loss):
  """The (query views, key views) orders each loss accepts, to try."""
  if loss == 'jcl':
    return [((0,), (0, 1, 2)), ((0,), (1, 2, 3)), ((1,), (0, 1))]
  if loss in ('cacr', 'byol'):
    return list(itertools.product(itertools.permutations(range(3), 2),
                                  repeat=2))
  return ([((0,), (0,)), ((0,), (1,)), ((0, 1), (0,))]
          + list(itertools.product(itertools.permutations(range(3), 2),
                                   repeat=2)))


@pytest.mark.parametrize('loss', sorted(RULES))
def test_the_stated_pairing_is_the_losses_own(loss):
  for query_views, key_views in _shapes(loss):
    q, k = _views(query_views, key_views)
    _, metrics = losses.apply(loss, losses.LossInputs(q, key=k),
                              **KWARGS[loss])
    pairs = moco.positive_pairs(RULES[loss], len(query_views), len(key_views))
    # The mean cosine over the positive pairs: 1 for a pair of one view, 0
    # for two views (an independent count from the stated rule).
    expected = np.mean([query_views[a] == key_views[b] for a, b in pairs])
    assert abs(float(metrics[SIMILARITY[loss]]) - expected) < 0.1, (
        loss, query_views, key_views, float(metrics[SIMILARITY[loss]]),
        expected)


def test_a_view_that_would_be_its_own_positive_is_refused():
  config = moco_v3_config.get_config()          # Pairs slot a with b != a.
  config_lib.validate(config, num_devices=8)
  config.moco.key_views = (1, 0)                # BYOL's order.
  with pytest.raises(ValueError, match=r'infonce pairs query slot a with key '
                     r'slot b != a, so view 0 would be its own positive'):
    config_lib.validate(config, num_devices=8)
  config = byol_config.get_config()             # Pairs slot v with v.
  config_lib.validate(config, num_devices=8)
  config.moco.key_views = (0, 1)                # MoCo v3's order.
  with pytest.raises(ValueError, match=r'byol pairs query slot a with key '
                     r'slot a, so view 0 would be its own positive'):
    config_lib.validate(config, num_devices=8)
