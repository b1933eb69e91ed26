"""pyproject.toml against requirements.txt: the ranges admit the exact pins.

requirements.txt is the tested set (exact pins); pyproject.toml declares the
same packages as ranges for `pip install -e .[extras]`. Every pin must lie
in its range, every pinned package must be declared (as a dependency or in
the extra that uses it), and the extras for accelerators must name jax's own.
`scripts/install_check.sh` (run by .ci/run) installs the package for real.
"""

import os
import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _project():
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    return tomllib.load(f)['project']


def _pins():
  pins = {}
  with open(os.path.join(ROOT, 'requirements.txt')) as f:
    for line in f:
      line = line.split('#')[0].strip()
      if line:
        name, version = re.fullmatch(r'([A-Za-z0-9_.\-]+)==(\S+)', line).groups()
        pins[canonicalize_name(name)] = version
  return pins


def _declared():
  project = _project()
  groups = {'': project['dependencies'], **project['optional-dependencies']}
  return {group: [Requirement(r) for r in reqs]
          for group, reqs in groups.items()}


def test_every_pin_is_declared_and_inside_its_range():
  pins = _pins()
  declared = _declared()
  seen = set()
  for group, reqs in declared.items():
    for req in reqs:
      name = canonicalize_name(req.name)
      if name == 'jax' and group in ('cuda', 'cuda13', 'tpu'):
        assert req.specifier.contains(pins['jax']), (group, req)
        continue
      assert name in pins, f'{req} ({group or "dependencies"}) is not pinned'
      assert req.specifier.contains(pins[name]), (
          f'{req} excludes the pin {name}=={pins[name]}')
      assert req.specifier, f'{req} has no range'
      seen.add(name)
  assert seen == set(pins), sorted(set(pins) - seen)


def test_test_and_notebook_tools_are_extras_not_dependencies():
  declared = _declared()
  core = {canonicalize_name(r.name) for r in declared['']}
  assert {'pytest', 'pytest-xdist'} <= {
      canonicalize_name(r.name) for r in declared['test']}
  assert {'jupytext', 'nbclient', 'nbformat', 'ipykernel'} <= {
      canonicalize_name(r.name) for r in declared['notebooks']}
  assert not core & {'pytest', 'pytest-xdist', 'jupytext', 'ipykernel'}


def test_accelerator_extras_are_jax_own():
  declared = _declared()
  assert [(r.name, r.extras) for r in declared['cuda']] == [('jax', {'cuda12'})]
  assert [(r.name, r.extras) for r in declared['cuda13']] == [
      ('jax', {'cuda13'})]
  assert [(r.name, r.extras) for r in declared['tpu']] == [('jax', {'tpu'})]


def test_console_scripts_and_packages():
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    pyproject = tomllib.load(f)
  assert pyproject['project']['scripts'] == {
      'contrastive-jax-train': 'contrastive_jax.cli:train',
      'contrastive-jax-eval': 'contrastive_jax.cli:evaluate'}
  assert pyproject['build-system']['build-backend'] == 'setuptools.build_meta'
  include = pyproject['tool']['setuptools']['packages']['find']['include']
  for package in ('contrastive_jax', 'input_pipeline', 'configs'):
    assert package + '*' in include
    assert os.path.exists(os.path.join(ROOT, package, '__init__.py'))
