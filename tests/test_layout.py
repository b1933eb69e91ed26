"""The package's structure: no import circle, a loop that reads in one screen,
no side effects on import, every evaluator type registered and defaulted."""

import ast
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, 'contrastive_jax')


def _modules() -> dict[str, str]:
  """contrastive_jax's module names -> their files."""
  out = {}
  for folder, _, files in os.walk(PACKAGE):
    for f in files:
      if f.endswith('.py'):
        path = os.path.join(folder, f)
        name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
        out[name.removesuffix('.__init__')] = path
  return out


def _imports(name: str, path: str, modules) -> set[str]:
  """The package modules `name` imports, at any depth of its code (lazy
  imports inside functions included). `from a import b` imports module a.b
  when there is one, else a."""
  deps = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.ImportFrom) and node.module:
      for alias in node.names:
        full = f'{node.module}.{alias.name}'
        deps.add(full if full in modules else node.module)
    elif isinstance(node, ast.Import):
      deps.update(alias.name for alias in node.names)
  return {d for d in deps if d in modules and d != name}


def _circles(graph: dict[str, set[str]]) -> list[str]:
  """The modules of `graph` (module -> the modules it imports) that reach
  themselves through one or more imports."""
  def reachable(start):
    seen, todo = set(), [start]
    while todo:
      for dep in graph[todo.pop()]:
        if dep not in seen:
          seen.add(dep)
          todo.append(dep)
    return seen

  return sorted(m for m in graph if m in reachable(m))


def test_no_module_imports_one_that_imports_it_back():
  modules = _modules()
  circles = _circles({m: _imports(m, p, modules) for m, p in modules.items()})
  assert not circles, f'modules on an import circle: {circles}'


def test_the_checker_finds_a_circle(tmp_path):
  # The same walk on modules that import each other lazily: a -> b -> a, and
  # c -> d -> e -> c. `_imports` drops a module's import of itself, so only
  # a search that follows imports past the first one finds these circles.
  files = {'a': 'def f():\n  from pkg import b\n', 'b': 'from pkg import a\n',
           'c': 'import pkg.d\n', 'd': 'from pkg import e\n',
           'e': 'from pkg import c\n', 'f': 'from pkg import a\n'}
  modules = {}
  for name, text in files.items():
    (tmp_path / f'{name}.py').write_text(text)
    modules[f'pkg.{name}'] = str(tmp_path / f'{name}.py')
  assert _imports('pkg.a', modules['pkg.a'], modules) == {'pkg.b'}
  assert _imports('pkg.b', modules['pkg.b'], modules) == {'pkg.a'}
  graph = {m: _imports(m, p, modules) for m, p in modules.items()}
  assert _circles(graph) == ['pkg.a', 'pkg.b', 'pkg.c', 'pkg.d', 'pkg.e']


def test_the_training_loop_reads_in_one_screen():
  tree = ast.parse(open(os.path.join(PACKAGE, 'train.py')).read())
  loop = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
              and n.name == 'train_and_evaluate')
  assert loop.end_lineno - loop.lineno + 1 < 90


def test_importing_the_package_changes_no_environment():
  code = ('import os; before = dict(os.environ); import contrastive_jax, '
          'contrastive_jax.train, contrastive_jax.losses; '
          'print(sorted(set(os.environ.items()) ^ set(before.items())))')
  env = {k: v for k, v in os.environ.items() if k != 'PJRT_NPROC'}
  env['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == '[]'


def test_every_evaluator_type_is_registered_with_its_defaults():
  from configs import base
  from contrastive_jax import config_lib
  from contrastive_jax import evaluators
  assert set(evaluators.TYPES) == {'knn', 'logreg', 'linear_eval',
                                   'diagnostics'}
  config = config_lib.with_defaults(base.get_config())
  built = evaluators.build(config)
  # base.py: kNN and logistic regression after training, the kNN monitor
  # every 200 steps, the papers' linear evaluation off (-1).
  assert {n: (e.type, e.every_steps) for n, e in built.items()} == {
      'knn': ('knn', 0), 'linear': ('logreg', 0), 'online_knn': ('knn', 200)}


def test_every_method_module_is_registered_and_unknown_names_are_refused():
  import pkgutil
  from contrastive_jax import methods
  modules = {m.name for m in pkgutil.iter_modules(methods.__path__)}
  assert set(methods.METHODS) == modules - {'base'}
  for name, cls in methods.METHODS.items():
    assert cls.__module__ == f'contrastive_jax.methods.{name}'
  with pytest.raises(ValueError, match="unknown method 'simclr'.*byol, "
                     'in_batch, memory_bank, moco'):
    methods.get('simclr')


def test_each_method_section_of_the_base_config_is_its_methods_defaults():
  # One place per default: configs/base.py takes config.moco and
  # config.memory_bank from the method modules, and the methods' own
  # dataclass fields start from the same values.
  import dataclasses
  from configs import base
  from contrastive_jax.methods import memory_bank, moco
  config = base.get_config()
  for section, module in (('moco', moco), ('memory_bank', memory_bank)):
    assert config[section].to_dict() == module.DEFAULTS
    fields = {f.name: f.default for f in dataclasses.fields(module.Method)}
    # moco.Method.momentum is the schedule built from two of the fields.
    shared = set(fields) & set(module.DEFAULTS) - (
        {'momentum'} if module is moco else set())
    assert len(shared) >= 3, section
    for name in shared:
      assert fields[name] == module.DEFAULTS[name], (section, name)


def test_a_saved_config_takes_the_defaults_and_names_renamed_options():
  from configs import base
  from contrastive_jax import config_lib
  saved = base.get_config().to_dict()
  del saved['optimizer']['clip_lr']           # an option added since
  assert config_lib.with_defaults(saved).optimizer.clip_lr is False
  saved['eval']['knn_ks'] = [200]             # an option renamed since
  with pytest.raises(ValueError, match='config.evals.knn.ks'):
    config_lib.with_defaults(saved)
  saved = base.get_config().to_dict()
  saved['optimizer']['clip_llr'] = True       # a typo
  with pytest.raises(ValueError, match='clip_llr is not an option'):
    config_lib.with_defaults(saved)


def test_a_saved_config_with_a_removed_option_loads_at_its_kept_value():
  # A run's config.json from before an option was removed still evaluates
  # when it held the value the code kept; another value is refused.
  from configs import base
  from contrastive_jax import config_lib
  saved = base.get_config().to_dict()
  saved['dataset']['imbalance_levels'] = 0
  saved['online']['classifier_learning_rate'] = 1e-3
  loaded = config_lib.with_defaults(saved)
  assert 'imbalance_levels' not in loaded.dataset
  assert 'classifier_learning_rate' not in loaded.online
  saved['dataset']['imbalance_levels'] = 4
  with pytest.raises(ValueError, match='imbalance_levels=4 is no longer an'):
    config_lib.with_defaults(saved)


def test_the_library_imports_neither_benchmarks_nor_studies():
  # The research record and the speed benchmarks sit on top of the library;
  # nothing in contrastive_jax/ or input_pipeline/ imports them.
  found = []
  for top in ('contrastive_jax', 'input_pipeline'):
    for folder, _, files in os.walk(os.path.join(ROOT, top)):
      for f in files:
        if not f.endswith('.py'):
          continue
        for node in ast.walk(ast.parse(open(os.path.join(folder, f)).read())):
          names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                   else [node.module or ''] if isinstance(node, ast.ImportFrom)
                   else [])
          found += [f'{f}: {n}' for n in names
                    if n.split('.')[0] in ('benchmarks', 'studies')]
  assert not found, found


def test_the_tests_refuse_fewer_than_8_cpu_devices(tmp_path):
  # An XLA_FLAGS that sets another device count stops the run before any
  # test (conftest), rather than skipping the 1-vs-8-device tests.
  (tmp_path / 'test_one.py').write_text('def test_x():\n  pass\n')
  shutil.copy(os.path.join(ROOT, 'tests', 'conftest.py'), tmp_path)
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=2',
             PYTHONPATH=ROOT, JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p',
                        'no:cacheprovider', str(tmp_path)], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 4, out.stdout[-2000:] + out.stderr[-2000:]
  assert 'the tests need 8 CPU devices' in out.stdout + out.stderr


def test_no_file_refers_to_a_path_outside_the_repository():
  # A reader of the repository cannot follow a path to a sibling folder of
  # the checkout, a private notes folder or a machine's absolute path.
  import re
  import subprocess as sp
  files = sp.run(['git', 'ls-files'], cwd=ROOT, capture_output=True,
                 text=True, check=True).stdout.split()
  notes = ('cacr', 'jcl', 'macl', 'tcl', 'peers_features', 'peers_style')
  pattern = re.compile('|'.join((
      r'\.\./' + 'shared', r'(?<![\w.-])notes/\w+\.md', '/' + r'work/\w',
      r'(?<![\w./-])(?:' + '|'.join(notes) + r')\.md\b')))
  found = []
  for name in files:
    if name.startswith('benchmarks/accelerator_results/') or name.endswith(
        ('.png', '.npz', '.json')):
      continue          # Raw measurement reports and binary files.
    try:
      text = open(os.path.join(ROOT, name), encoding='utf-8').read()
    except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
      continue
    found += [f'{name}: {m.group(0)}' for m in pattern.finditer(text)]
  assert not found, found
