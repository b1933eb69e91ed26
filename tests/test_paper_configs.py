"""configs/papers/*: every method at every scale validates, documents its
launch and target, builds the paper's encoder; each runs through main.py.

The end-to-end runs use 16 virtual CPU devices, a generated JPEG folder and
sizes cut down by flags only (image side, batch, encoder depth and width,
epochs): the method, loss, optimizer, schedule, augmentation, precision and
evaluation protocols are the config's own, which the test checks by comparing
the run's config.json with the config file's.
"""

import importlib
import json
import os
import pkgutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import configs.papers
from configs.papers import common
from contrastive_jax import step as step_lib
from contrastive_jax import runtime
from contrastive_jax import optim
from contrastive_jax import config_lib
from contrastive_jax import train
from contrastive_jax import workdir as workdir_lib
from synthetic_data import make_jpeg_folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = sorted(m.name for m in pkgutil.iter_modules(configs.papers.__path__)
                 if m.name != 'common')
# torchvision's resnet50 / resnet18 parameter counts minus the classifier
# (2048 x 1000 + 1000 and 512 x 1000 + 1000); the CIFAR stem's 3x3 conv has
# 64 x 3 x (49 - 9) fewer weights than torchvision's 7x7 one.
_CIFAR_R18 = 11_689_512 - 513_000 - 64 * 3 * (49 - 9)
ENCODER_PARAMS = {'imagenet': 25_557_032 - 2_049_000,
                  'cifar10': _CIFAR_R18, 'cifar100': _CIFAR_R18}


def _load(method):
  return importlib.import_module(f'configs.papers.{method}')


def test_every_method_of_the_issue_has_a_paper_config():
  assert {'simclr', 'moco_v2', 'moco_v3', 'insdis', 'supcon', 'tcl', 'cacr',
          'macl', 'jcl'} <= set(METHODS)


@pytest.mark.parametrize('scale', common.SCALES)
@pytest.mark.parametrize('method', METHODS)
def test_config_validates_documents_and_builds_the_paper_encoder(method,
                                                                 scale):
  module = _load(method)
  config = module.get_config(scale)
  config_lib.validate(config, num_devices=16)
  doc = module.__doc__
  # The launch command of this scale, and a published number as the paper's.
  assert f'--config=configs/papers/{method}.py:{scale}' in doc
  assert 'Paper:' in doc and '%' in doc
  expected_name = 'imagenet2012' if scale == 'imagenet' else scale
  assert config.dataset.name == expected_name
  model = step_lib.create_model(config)
  side = 224 if scale == 'imagenet' else 32
  variables = jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.zeros((2, side, side, 3)), train=False))
  encoder = variables['params']['base']['encoder'] if 'base' in variables[
      'params'] else variables['params']['encoder']
  count = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(encoder))
  assert count == ENCODER_PARAMS[scale]
  assert config.model.dtype == 'bfloat16'


def test_unknown_scale_names_the_known_ones():
  with pytest.raises(ValueError, match='imagenet, cifar10, cifar100'):
    _load('simclr').get_config('imagenet21k')


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('jpeg'))
  make_jpeg_folder(root, num_train=64, num_test=32)
  return root


# Cut-down sizes: 16 devices x 2 images, 2 steps, 32 px, one block per
# stage of width 8; evaluation on 32 images: the kNN and 1 epoch of the
# papers' linear evaluation (the fast L-BFGS probe, tested elsewhere, off).
CUT = {
    'dataset.name': 'image_folder', 'dataset.train_split': 'train',
    'dataset.eval_split': 'test', 'dataset.image_size': 32,
    'dataset.in_memory': False, 'batch_size': 32, 'num_epochs': 1.0,
    'model.encoder_kwargs.stage_sizes': (1, 1, 1, 1),
    'model.encoder_kwargs.width': 8, 'model.head_hidden_dim': 32,
    'model.head_out_dim': 16, 'eval.batch_size': 32, 'evals.knn.ks': (10,),
    'evals.linear.every_steps': -1, 'evals.linear_eval.epochs': 1,
    'evals.linear_eval.batch_size': 32, 'evals.online_knn.every_steps': -1,
    'log_every_steps': 1,
}


def _flag(key, value):
  if isinstance(value, tuple):
    value = '(' + ','.join(str(v) for v in value) + (',)' if len(value) == 1
                                                     else ')')
  return f'--config.{key}={value}'


# End to end through main.py: every method, each at one of its scales, mixed
# so that every scale and both encoders (Bottleneck ResNet-50 with the
# ImageNet stem, BasicBlock ResNet-18 with the CIFAR stem) run, and every code
# path does (the predictor and LARS, the memory bank and the step schedule,
# five views through the key encoder and its queue, in-batch SGD, labels).
# Each method is also built and lowered at full size at another scale below
# (~3 s each instead of ~30 s), which keeps CI under its 20 minutes.
RUNS = [('moco_v3', 'imagenet'), ('insdis', 'imagenet'), ('cacr', 'imagenet'),
        ('jcl', 'imagenet'), ('simclr', 'cifar10'), ('tcl', 'cifar10'),
        ('macl', 'cifar10'), ('moco_v2', 'cifar100'), ('supcon', 'cifar100'),
        ('dcl', 'cifar100')]


def test_every_method_runs_end_to_end_and_every_scale_is_covered():
  assert sorted(m for m, _ in RUNS) == METHODS
  assert {s for _, s in RUNS} == set(common.SCALES)


@pytest.mark.parametrize('method,scale', RUNS)
def test_runs_two_steps_on_16_devices_through_main(method, scale, folder,
                                                   tmp_path):
  workdir = str(tmp_path / 'run')
  cut = dict(CUT, **{'dataset.data_dir': folder})
  out = subprocess.run(
      [sys.executable, 'main.py',
       f'--config=configs/papers/{method}.py:{scale}', f'--workdir={workdir}',
       '--progress=off', *(_flag(k, v) for k, v in cut.items())],
      cwd=REPO, capture_output=True, text=True, timeout=900,
      # LLVM optimisation level 0: the CPU backend compiles these programs
      # ~2x faster (the step: 13 s instead of 29 s); XLA's HLO passes, the
      # partitioning over the 16 devices included, run as usual.
      # The worker's compilation cache (conftest.py) is inherited: the runs
      # share most programs (a second run at a scale: 18 s instead of 39 s).
      env=dict(os.environ,
               XLA_FLAGS='--xla_force_host_platform_device_count=16 '
                         '--xla_backend_optimization_level=0'))
  assert out.returncode == 0, out.stderr[-4000:]
  assert '16 local / 16 global devices' in out.stderr
  with open(os.path.join(workdir, 'results.json')) as f:
    results = json.load(f)
  assert results['steps'] == 2 and np.isfinite(results['final_loss'])
  assert 0. <= results['trained/linear_eval_top1'] <= 1.
  assert 'trained/linear_top1' not in results          # Fast probe off.
  assert "the papers' linear evaluation" in out.stdout  # In the summary.
  assert 0. <= results['trained/knn_weighted_top1@10'] <= 1.
  # What ran is the paper config, changed only where the flags cut sizes.
  with open(os.path.join(workdir, 'config.json')) as f:
    ran = workdir_lib._flatten(json.load(f))
  want = workdir_lib._flatten(json.loads(_load(method).get_config(
      scale).to_json_best_effort()))
  changed = {k for k in set(ran) | set(want) if ran.get(k) != want.get(k)}
  tuples = {k for k in changed if isinstance(want.get(k), (list, tuple))
            and list(want[k]) == ran.get(k)}
  assert changed - tuples <= set(cut), changed - tuples - set(cut)


_LOWER = r"""
import importlib, json, sys
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from contrastive_jax import runtime
from contrastive_jax import step as step_lib
mesh = runtime.create_mesh()
rows = NamedSharding(mesh, P('data'))
for method, scale in json.loads(sys.argv[1]):
  c = importlib.import_module(f'configs.papers.{method}').get_config(scale)
  c.batch_size = 2 * mesh.size                 # 2 images per device.
  if c.moco.queue_size:
    c.moco.queue_size = 4 * c.batch_size         # Whole batches.
  side = 224 if scale == 'imagenet' else 32
  setup = step_lib.build(c, mesh, total_steps=10, steps_per_epoch=5,
                      num_examples=1000, image_shape=(side, side, 3),
                      num_classes=10)
  state = jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
      jax.eval_shape(setup.init_fn, jax.random.key(0)), setup.shardings)
  shape = lambda *s, dtype=jnp.float32: jax.ShapeDtypeStruct(
      s, dtype, sharding=rows)
  batch = {'views': shape(c.batch_size, c.augment.num_views, side, side, 3),
           'label': shape(c.batch_size, dtype=jnp.int32),
           'index': shape(c.batch_size, dtype=jnp.int32)}
  setup.step_fn.lower(state, batch, jax.random.key(0))
  print('lowered', method, scale, mesh.size, flush=True)
"""


def test_full_size_steps_of_the_other_scales_lower_on_16_devices():
  # The end-to-end runs above cut the encoder's depth and width; here each
  # method at another scale builds its model,
  # optimizer, train state and jitted step at full depth and width (ResNet-50
  # / ResNet-18), 2 images per device, and lowers it for a 16-device mesh.
  # One other scale per method, with the other encoder: cifar10 and
  # cifar100 differ only in their dataset (every pair is validated and its
  # encoder built above).
  ran = dict(RUNS)
  others = [(m, 'cifar10' if ran[m] == 'imagenet' else 'imagenet')
            for m in METHODS]
  out = subprocess.run(
      [sys.executable, '-c', _LOWER, json.dumps(others)], cwd=REPO,
      capture_output=True, text=True, timeout=900,
      env=dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=16'))
  assert out.returncode == 0, out.stderr[-4000:]
  lowered = [tuple(line.split()[1:]) for line in out.stdout.splitlines()
             if line.startswith('lowered')]
  assert lowered == [(m, s, '16') for m, s in others]


def test_resnet_configs_outside_papers_build_and_lower():
  # configs/*.py experiments on a ResNet (GPU-sized runs such as
  # simclr_resnet18_fmnist), which the small-CNN pinned steps cannot narrow:
  # each validates, builds its full-size model and step, and lowers it on
  # the 8 test devices at 2 images per device, on its dataset's image shape.
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  names = sorted(n for _, n, is_pkg in pkgutil.iter_modules(
      [os.path.join(REPO, 'configs')]) if not is_pkg and n != 'test')
  resnets = [n for n in names if importlib.import_module(
      f'configs.{n}').get_config().model.encoder != 'small_cnn']
  assert 'simclr_resnet18_fmnist' in resnets
  mesh = runtime.create_mesh()
  rows = NamedSharding(mesh, P('data'))
  for name in resnets:
    c = importlib.import_module(f'configs.{name}').get_config()
    config_lib.validate(c)
    c.batch_size = 2 * mesh.size
    setup = step_lib.build(c, mesh, total_steps=10, steps_per_epoch=5,
                        num_examples=1000, image_shape=(28, 28, 1),
                        num_classes=10)
    state = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        jax.eval_shape(setup.init_fn, jax.random.key(0)), setup.shardings)
    shape = lambda *s, dtype=jnp.float32: jax.ShapeDtypeStruct(
        s, dtype, sharding=rows)
    batch = {'views': shape(c.batch_size, c.augment.num_views, 28, 28, 1),
             'label': shape(c.batch_size, dtype=jnp.int32),
             'index': shape(c.batch_size, dtype=jnp.int32)}
    text = setup.step_fn.lower(state, batch, jax.random.key(0)).as_text()
    # bf16 compute: the convolutions take bf16 operands.
    assert 'convolution' in text and 'bf16' in text


# Every hyperparameter value is pinned by tests/test_recipes.py against
# configs/papers/recipes.yaml; this checks what the warmup values do.
@pytest.mark.parametrize('scale', ['cifar10', 'cifar100'])
def test_supcon_cifar_warms_up_10_epochs_from_0_01(scale):
  # SupContrast main_supcon.py (batch > 256): warm_epochs 10 from 0.01 to the
  # peak, lr 0.5 at batch 1024.
  c = _load('supcon').get_config(scale)
  steps_per_epoch = 50
  total = int(c.num_epochs) * steps_per_epoch
  lr = optim.learning_rate_schedule(c, total_steps=total)
  assert float(lr(0)) == pytest.approx(0.01)
  assert float(lr(5 * steps_per_epoch)) == pytest.approx((0.01 + 0.5) / 2)
  assert float(lr(10 * steps_per_epoch)) == pytest.approx(0.5)


@pytest.mark.parametrize('method,scale,peak', [
    ('supcon', 'cifar10', 0.5), ('supcon', 'cifar100', 0.5),
    ('tcl', 'imagenet', 0.3 * 256 / 128), ('tcl', 'cifar10', 0.1),
    ('tcl', 'cifar100', 0.2)])
def test_supcon_and_tcl_cosines_end_at_1e_3_of_the_peak(method, scale, peak):
  # SupContrast util.py adjust_learning_rate (and TCL's train.py copy):
  # eta_min = lr x lr_decay_rate^3 = 1e-3 x lr, the cosine's last value;
  # halfway through the cosine, eta_min + (lr - eta_min) / 2.
  c = _load(method).get_config(scale)
  steps_per_epoch = 50
  total = int(c.num_epochs) * steps_per_epoch
  warmup = int(c.optimizer.warmup_fraction * total)
  lr = optim.learning_rate_schedule(c, total_steps=total)
  floor = 1e-3 * peak
  assert float(lr(warmup)) == pytest.approx(peak, rel=1e-6)
  assert float(lr((warmup + total) // 2)) == pytest.approx(
      floor + (peak - floor) / 2, rel=1e-5)
  assert float(lr(total)) == pytest.approx(floor, rel=1e-5)
