"""What a run reports: its training log, results.json, summary.png, summary.

results.json's training entries, over the invocations of one run: `steps`,
`resumed_from_step`, `steps_this_run`, `train_seconds_this_run`,
`train_seconds` (summed over the invocations that made the final state, None
when one left no record), `images_per_sec` (median of the logged intervals,
compilation excluded), `input_wait` (share of this invocation's timed
training time spent waiting for batches) and `final_loss`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
import numpy as np
from absl import logging

from contrastive_jax import event_writer
from contrastive_jax import progress
from contrastive_jax import storage


def write_json(path: str, obj) -> None:
  """Writes `obj` to `path` (local or remote) atomically."""
  storage.write_atomic(path, json.dumps(obj, indent=2, sort_keys=True))


def read_json(path: str, default=None):
  """The JSON in `path`, or `default` when there is no such file."""
  text = storage.read_text(path)
  return default if text is None else json.loads(text)


def fmt_time(seconds: float) -> str:
  m, s = divmod(int(seconds), 60)
  return f'{m}m{s:02d}s'


def _duration(seconds: float) -> str:
  return f'{seconds:.1f} s' if seconds < 60 else fmt_time(seconds)


# {"<checkpoint step>": cumulative training seconds}.
TIMES_FILE = 'train_seconds.json'


class TrainLog:
  """The scalars of a training run, from step `start` to `total_steps`.

  `step` records every step and logs every `config.log_every_steps` (stopping
  on a non-finite value) to TensorBoard, the history and the log; `save`
  writes the history and training seconds with each checkpoint. `input`
  wraps the batches to time the wait for each: `input_wait` is its share of
  the log interval (near 1: the devices wait for data).
  """

  def __init__(self, workdir: str, config, *, start: int, total_steps: int):
    self.workdir, self.config = workdir, config
    self.total_steps = total_steps
    self.path = os.path.join(workdir, 'history.json')
    # Entries past the restored step belong to steps that will be redone.
    self.history = [h for h in read_json(self.path, [])
                    if h['step'] <= start]
    self.times_path = os.path.join(workdir, TIMES_FILE)
    self.times = {k: v for k, v in read_json(self.times_path, {}).items()
                  if int(k) <= start}
    # Training seconds of the earlier invocations, up to the restored step.
    self.seconds_before = self.times.get(str(start)) if start else 0.0
    self.writer = event_writer.EventWriter(
        workdir if jax.process_index() == 0 else None)
    # TensorBoard drops the events from `start` on; rewrite that step's.
    self.writer.restart(start)
    if self.history and self.history[-1]['step'] == start:
      self.writer.write_scalars(start, {
          k: v for k, v in self.history[-1].items() if k != 'step'})
    self.every = config.log_every_steps
    self.line_every = self.every
    if progress.enabled():
      self.line_every *= max(1, total_steps // 10 // self.every)
    self.start = self.timed_from = self.last_step = self.done = start
    self.began = self.t0 = self.last_time = time.time()
    self.ended = None
    # Seconds spent waiting for batches: since t0, and at the last log step.
    self.waited = self.last_waited = 0.0

  def input(self, batches):
    it = iter(batches)
    while True:
      t = time.perf_counter()
      batch = next(it, None)
      if batch is None:
        return
      self.waited += time.perf_counter() - t
      yield batch

  def step(self, done: int, metrics, learning_rate: float, bar) -> bool:
    """Records step `done`; True when it was a log step."""
    bar.update(1)
    self.done = done
    if done == self.start + 1:
      # The first step compiles: time from its end.
      jax.block_until_ready(metrics)
      self.t0 = self.last_time = time.time()
      self.timed_from = self.last_step = done
      self.waited = self.last_waited = 0.0
      bar.restart_clock()
    if done % self.every and done != self.total_steps:
      return False
    metrics = jax.device_get(metrics)  # Replicated: every process has it.
    for name, value in metrics.items():
      if not np.isfinite(value):
        raise FloatingPointError(
            f'{name} is {value} at step {done}; stopping. The last good '
            f'checkpoint in {self.workdir}/checkpoints is kept.')
    now = time.time()
    scalars = {k: float(v) for k, v in metrics.items()}
    scalars['learning_rate'] = float(learning_rate)
    speed = eta = ''
    if done > self.timed_from:     # Not the compiling first step alone.
      scalars['images_per_sec'] = ((done - self.last_step) *
                                   self.config.batch_size /
                                   (now - self.last_time))
      scalars['input_wait'] = min(1.0, (self.waited - self.last_waited) /
                                  (now - self.last_time))
      speed = (f'  {scalars["images_per_sec"]:.0f} img/s'
               f'  input wait {100 * scalars["input_wait"]:.0f}%')
      eta = '  ETA ' + fmt_time((self.total_steps - done) * (now - self.t0) /
                                (done - self.timed_from))
    self.writer.write_scalars(done, scalars)
    self.history.append({'step': done, **scalars})
    bar.set_postfix_str(f'loss {scalars["loss"]:.4f}{speed}')
    if done % self.line_every == 0 or done == self.total_steps:
      logging.info('step %d/%d  loss %.4f%s%s', done, self.total_steps,
                   scalars['loss'], speed, eta)
    self.last_step, self.last_time = done, now
    self.last_waited = self.waited
    return True

  def online(self, done: int, values: dict[str, float]) -> None:
    self.writer.write_scalars(done, values)
    if self.history and self.history[-1]['step'] == done:
      self.history[-1].update(values)
    else:
      self.history.append({'step': done, **values})
    logging.info('step %d  %s', done, ', '.join(
        f'{k} {v:.4f}' for k, v in values.items()))

  def save(self) -> None:
    """history.json, the training seconds and the events, with a checkpoint."""
    self.writer.flush()
    if jax.process_index() == 0:
      write_json(self.path, self.history)
      if self.seconds_before is not None:
        self.times[str(self.done)] = round(
            self.seconds_before + time.time() - self.began, 1)
        write_json(self.times_path, self.times)

  def end_training(self) -> None:
    """Stops the training clock; the final checkpoint's time gets the total."""
    self.ended = time.time()
    total = self.results()['train_seconds']
    if (self.done > self.start and total is not None and
        str(self.done) in self.times and jax.process_index() == 0):
      self.times[str(self.done)] = total
      write_json(self.times_path, self.times)

  def results(self) -> dict[str, Any]:
    """results.json's training entries and the last online metrics."""
    this_run = ((self.ended or time.time()) - self.began
                if self.done > self.start else 0.0)
    out = {'steps': self.total_steps,
           'steps_this_run': self.done - self.start,
           'train_seconds_this_run': round(this_run, 1),
           'train_seconds': (None if self.seconds_before is None else
                             round(self.seconds_before + this_run, 1))}
    seconds = self.last_time - self.t0   # Up to the last log step.
    if self.last_step > self.timed_from and seconds > 0:
      out['input_wait'] = round(min(1.0, self.last_waited / seconds), 4)
    logged = [h for h in self.history if 'loss' in h]
    if logged:
      out['final_loss'] = logged[-1]['loss']
      speeds = [h['images_per_sec'] for h in logged if 'images_per_sec' in h]
      if speeds:
        out['images_per_sec'] = float(np.median(speeds))
    for h in reversed(self.history):
      for k, v in h.items():
        if k.startswith('online/'):
          out.setdefault(k, v)
    return out

  def finish(self, results: dict[str, Any], embeddings, classes=None) -> None:
    """Writes results.json and summary.png, prints the summary (process 0).

    TensorBoard gets the results' floats that are no training log tag."""
    logged = {k for h in self.history for k in h}
    self.writer.write_scalars(self.total_steps, {
        k: v for k, v in results.items()
        if isinstance(v, float) and k not in logged})
    self.writer.close()
    if jax.process_index() != 0:
      return
    write_json(os.path.join(self.workdir, 'results.json'), results)
    t = time.time()
    plot_run(self.history, results, embeddings,
             os.path.join(self.workdir, 'summary.png'), classes=classes)
    logging.info('Wrote summary.png (%.0f s, mostly t-SNE).', time.time() - t)
    print(summary(results, self.workdir), flush=True)


def _curve(ax, history, key, *, single: str = 'o', **kw) -> int:
  """Plots `key` of the history (one point: marker `single`); its points."""
  points = [(h['step'], h[key]) for h in history if key in h]
  if len(points) == 1 and not kw.get('marker'):
    kw['marker'] = single
  if points:
    ax.plot(*zip(*points), **kw)
  return len(points)


def _twin(ax, history, key, ylabel: str, color: str, **kw) -> None:
  """`key` on a twin axis; a lone point is a cross: the first curve's dot
  shows under it."""
  twin = ax.twinx()
  if _curve(twin, history, key, color=color, single='x', **kw):
    twin.set_ylabel(ylabel, color=color)


def _too_few(ax, n: int, what: str) -> None:
  if n > 1:
    return
  text = (f'no {what} logged' if n == 0 else
          f'{what}: one logged step,\ntoo few points for a curve\n'
          '(config.log_every_steps)')
  ax.text(0.5, 0.2, text, transform=ax.transAxes, ha='center', va='center',
          fontsize=9,
          bbox={'facecolor': 'white', 'alpha': 0.8, 'edgecolor': 'none'})


def _scored(results) -> tuple[list[str], str | None]:
  """The representations `results` scores, and its trained kNN metric."""
  reps = [r for r in ('raw_pixels', 'random_init', 'trained')
          if any(k.startswith(r + '/') for k in results)]
  return reps, next((k.split('/', 1)[1] for k in sorted(results)
                     if k.startswith('trained/knn_weighted_top1')), None)


def plot_run(history, results, embeddings, path: str, *, classes=None,
             split: str = 'test'):
  """Writes summary.png and returns its matplotlib Figure.

  Panels: loss and learning rate; online monitors; alignment and uniformity
  (Wang & Isola 2020); final kNN and linear accuracy against the baselines;
  t-SNE of test features of the trained encoder and the first baseline.
  """
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  from contrastive_jax.evaluators import diagnostics  # pylint: disable=g-import-not-at-top

  # No pyplot: the global backend (a notebook's) is left alone.
  fig = Figure(figsize=(16, 9), dpi=90)
  FigureCanvasAgg(fig)
  axes = fig.subplots(2, 3)
  ax = axes[0, 0]
  _too_few(ax, _curve(ax, history, 'loss', color='C0'), 'loss')
  ax.set(xlabel='step', ylabel='training loss', title='Loss and learning rate')
  _twin(ax, history, 'learning_rate', 'learning rate (dashed)', 'C1',
        linestyle='--')

  ax = axes[0, 1]
  knn_keys = sorted({k for h in history for k in h
                     if k.startswith('online/knn')})
  monitors = ([('online/linear_acc', 'online classifier (training batch)')]
              + [(k, k.split('/')[1] + ' (test subset)') for k in knn_keys])
  counts = [_curve(ax, history, key, marker='.' if 'knn' in key else None,
                   label=label) for key, label in monitors]
  ax.set(xlabel='step', ylabel='accuracy', title='Online monitors')
  if ax.lines:
    ax.legend(fontsize='small')
    # Accuracies are fractions: the axis stops at 0 and 1.
    bottom, top = ax.get_ylim()
    ax.set_ylim(max(bottom, 0.), min(top, 1.))
  _too_few(ax, max(counts), 'online monitors')

  ax = axes[0, 2]
  _too_few(ax, _curve(ax, history, 'alignment', color='C2',
                      label='alignment'), 'alignment and uniformity')
  ax.set(xlabel='step', title='Alignment and uniformity (lower is better)')
  ax.set_ylabel('alignment', color='C2')
  _twin(ax, history, 'uniformity', 'uniformity', 'C3', label='uniformity')

  ax = axes[1, 0]
  reps, knn_key = _scored(results)
  metrics = ((knn_key, 'kNN'), ('linear_top1', 'linear'))
  bars = []
  for j, (metric, label) in enumerate(metrics):
    vals = [100 * results.get(f'{r}/{metric}', float('nan')) for r in reps]
    ys = np.arange(len(reps)) + (j - 0.5) * 0.38
    ax.barh(ys, vals, height=0.38, label=label)
    bars += [(y, v) for y, v in zip(ys, vals) if np.isfinite(v)]
  ax.set_yticks(range(len(reps)), reps)
  # Zoomed on the values, room for the legend, up to 100%.
  shown_vals = [v for _, v in bars]
  lo = max(0., min(shown_vals, default=0.) - 8.)
  hi = min(100., max(shown_vals, default=88.) + 12.)
  for y, v in bars:
    # A value near the axis' end goes inside its bar.
    inside = v > hi - 0.12 * (hi - lo)
    ax.text(v, y, f'{v:.1f} ' if inside else f' {v:.1f}', va='center',
            ha='right' if inside else 'left', fontsize=8,
            color='white' if inside else 'black')
  baselines = [r for r in reps if r != 'trained']
  ax.set(xlim=(lo, hi), xlabel=f'{split} accuracy (%), axis from {lo:.0f}',
         title=('Frozen features: trained vs ' + ' and '.join(baselines)
                if baselines else 'Frozen features: the trained encoder'))
  pairs = [(label, f'trained/{m}', f'random_init/{m}') for m, label in metrics]
  gaps = [f'{label} {100 * (results[t] - results[r]):+.1f}'
          for label, t, r in pairs if t in results and r in results]
  if gaps:
    ax.text(0.02, 0.98, 'trained - random init: ' + ', '.join(gaps),
            transform=ax.transAxes, va='top', fontsize=8,
            bbox={'facecolor': 'white', 'alpha': 0.8, 'edgecolor': 'none'})
  ax.legend(fontsize='small', loc='best')

  shown = [r for r in ('trained', 'random_init', 'raw_pixels')
           if r in embeddings][:2]
  for ax, rep in zip(axes[1, 1:], shown):
    x, labels = embeddings[rep]
    diagnostics.scatter_classes(ax, diagnostics.project_2d(x, 'tsne'),
                                labels, legend=rep == 'trained',
                                names=classes)
    ax.set(xticks=[], yticks=[],
           title=f't-SNE of {len(x)} {split} features: {rep}')
  for ax in axes[1, 1 + len(shown):]:
    ax.set_axis_off()
  fig.tight_layout()
  storage.save_figure(fig, path)
  return fig


# The input-wait share from which the summary calls a run input-bound.
INPUT_BOUND = 0.1


# The summary table's column widths (name, kNN, linear) and rule width.
_NAME, _KNN, _LINEAR = 16, 26, 14
_RULE = 64


def _row(name: str, knn: str = '', linear: str = '') -> str:
  if knn:
    return f'{name:<{_NAME}}{knn:>{_KNN}}{linear:>{_LINEAR}}'
  return f'{name:<{_NAME + _KNN}}{linear:>{_LINEAR}}'


def _pct(x: float) -> str:
  return f'{100 * x:.2f}%'


def _training_lines(results: dict) -> list[str]:
  """Steps, seconds, images/s and final loss of results.json, in words."""
  this_run = results.get('steps_this_run')
  if this_run is None:       # Not a training run's results.
    return []
  steps, total_s = results.get('steps'), results.get('train_seconds')
  resumed = results.get('resumed_from_step') or 0
  at = f'resumed at step {resumed} of {steps}'
  total = '' if total_s is None else f'{steps} steps in {_duration(total_s)}'
  if this_run == 0:
    line = f'training: none in this invocation ({at})'
    if total:
      line += f'; earlier invocations: {total}'
  else:
    line = (f'training: {this_run} steps in '
            f'{_duration(results["train_seconds_this_run"])}')
    if resumed:
      line += f' in this invocation ({at})'
      if total:
        line += f'; all invocations: {total}'
  speed = results.get('images_per_sec')
  if speed is None:
    rate = 'images/s not measured (no log interval after a compiling step)'
  else:
    which = ((' of the earlier invocations' if this_run == 0 else
              ' of all invocations') if resumed else '')
    rate = (f'{speed:.0f} images/s (median of the logged intervals{which}, '
            'compilation excluded)')
  if 'final_loss' in results:
    rate += f', final loss {results["final_loss"]:.4f}'
  return [line, rate]


def summary(results: dict, workdir: str) -> str:
  """A one-screen text summary of a finished run."""
  rows, knn_key = _scored(results)
  lines = ['', '=' * _RULE,
           _row('representation', knn_key or 'knn', 'linear_top1'),
           '-' * _RULE]
  for n in rows:
    lines.append(_row(n, _pct(results.get(f'{n}/{knn_key}', float('nan'))),
                      _pct(results.get(f'{n}/linear_top1', float('nan')))))
  if 'trained/linear_eval_top1' in results:
    lines.append(_row("trained, the papers' linear evaluation",
                      linear=_pct(results['trained/linear_eval_top1'])))
  if skipped := results.get('data/skipped_records'):
    lines.append(f'{skipped} undecodable images replaced in training, left '
                 'out of the scores (data/skipped_files)')
  lines += ['-' * _RULE, *_training_lines(results)]
  if (wait := results.get('input_wait')) is not None:
    lines.append(f'input wait {100 * wait:.0f}% of the training time' + (
        '' if wait < INPUT_BOUND else ': input-bound, the devices waited for '
        'batches (decoding in worker processes, config.dataset.num_workers: '
        'docs/input_pipeline.md)'))
  lines += [f'results: {workdir}/results.json  plot: {workdir}/summary.png',
            f'TensorBoard: tensorboard --logdir {workdir}', '=' * _RULE]
  return '\n'.join(lines)
