"""What a run reports: its training log, results.json, summary.png and the
summary table.

`TrainLog` keeps the scalars of the training loop (TensorBoard events from
process 0, `history.json` for resuming and plots, the log lines with speed
and ETA); `finish` writes results.json, draws summary.png and prints the
summary. Every JSON file of a run goes through `write_json`, atomically.
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
  """Writes `obj` to `path` (local or remote) atomically: never a
  half-written file (`storage.write_atomic`)."""
  storage.write_atomic(path, json.dumps(obj, indent=2, sort_keys=True))


def read_json(path: str, default=None):
  """The JSON in `path`, or `default` when there is no such file."""
  text = storage.read_text(path)
  return default if text is None else json.loads(text)


def fmt_time(seconds: float) -> str:
  m, s = divmod(int(seconds), 60)
  return f'{m}m{s:02d}s'


class TrainLog:
  """The scalars of a training run, from step `start` to `total_steps`.

  `step` takes every step's metrics (device arrays) and, every
  `config.log_every_steps` steps, fetches them, stops on a non-finite value,
  adds the learning rate, images/s and the input wait (all timed from the
  end of the first, compiling, step), and writes them to TensorBoard and the
  history; a log line every ~10% of the run under a progress bar, else every
  log step. `online` adds the online evaluators' values at a step.

  Input wait: the training loop takes its batches through `input(batches)`,
  which counts the time spent waiting for each one (reading, decoding and
  moving it to the devices, where the prefetch has not done so already);
  `input_wait` is that time's share of the log interval's wall time. The
  step runs asynchronously, so a loop that is never input-bound spends its
  time blocked on the devices instead and shows a share near 0; a share
  near 1 means the devices sit idle waiting for data.
  """

  def __init__(self, workdir: str, config, *, start: int, total_steps: int):
    self.workdir, self.config = workdir, config
    self.total_steps = total_steps
    self.path = os.path.join(workdir, 'history.json')
    # Entries past the restored step belong to steps that will be redone.
    self.history = [h for h in read_json(self.path, [])
                    if h['step'] <= start]
    self.writer = event_writer.EventWriter(
        workdir if jax.process_index() == 0 else None)
    self.every = config.log_every_steps
    self.line_every = self.every
    if progress.enabled():
      self.line_every *= max(1, total_steps // 10 // self.every)
    self.start = self.timed_from = self.last_step = start
    self.t0 = self.last_time = time.time()
    # Seconds spent waiting for batches: since t0, and at the last log step.
    self.waited = self.last_waited = 0.0

  def input(self, batches):
    """Yields from `batches`, adding the time each `next` takes to
    `waited` (the input wait, see the class docstring)."""
    it = iter(batches)
    while True:
      t = time.perf_counter()
      try:
        batch = next(it)
      except StopIteration:
        return
      self.waited += time.perf_counter() - t
      yield batch

  def step(self, done: int, metrics, learning_rate: float, bar) -> bool:
    """Records step `done`; True when it was a log step."""
    bar.update(1)
    if done == self.start + 1:
      # The first step compiles: time from its end, so images/s and the
      # ETA are the steady state's, not diluted by compilation.
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
    """history.json and the TensorBoard events so far, with a checkpoint."""
    self.writer.flush()
    if jax.process_index() == 0:
      write_json(self.path, self.history)

  def results(self) -> dict[str, Any]:
    """results.json's training entries: the final loss, the median images/s,
    the input wait of this invocation's timed steps and the last value of
    every online metric."""
    out = {}
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
    """Writes results.json and summary.png, prints the summary (process 0)."""
    self.writer.write_scalars(self.total_steps, {
        k: v for k, v in results.items() if isinstance(v, float)})
    self.writer.close()
    if jax.process_index() != 0:
      return
    write_json(os.path.join(self.workdir, 'results.json'), results)
    t = time.time()
    plot_run(self.history, results, embeddings,
             os.path.join(self.workdir, 'summary.png'), classes=classes)
    logging.info('Wrote summary.png (%.0f s, mostly t-SNE).', time.time() - t)
    print(summary(results, self.workdir), flush=True)


def _curve(ax, history, key, **kw) -> bool:
  """Plots `key` of the history entries that have it; False if none has."""
  points = [(h['step'], h[key]) for h in history if key in h]
  if points:
    ax.plot(*zip(*points), **kw)
  return bool(points)


def plot_run(history, results, embeddings, path: str, *, classes=None,
             split: str = 'test') -> None:
  """Writes summary.png: what a run did and what it learnt.

  Panels: (1) the loss and the learning rate; (2) the online monitors (the
  linear probe's training-batch accuracy, the periodic kNN) over steps;
  (3) alignment and uniformity of the batch's embeddings (Wang & Isola 2020,
  lower is better); (4) the final kNN and linear accuracy of the trained
  encoder against the baselines; (5, 6) t-SNE maps of test features of the
  trained encoder and of the first baseline, coloured by class (`classes`:
  the class names, else their ids).
  """
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  from contrastive_jax.evaluators import diagnostics  # pylint: disable=g-import-not-at-top

  # No pyplot: the global backend (a notebook's) is left alone.
  fig = Figure(figsize=(16, 9), dpi=90)
  FigureCanvasAgg(fig)
  axes = fig.subplots(2, 3)
  ax = axes[0, 0]
  _curve(ax, history, 'loss', color='C0')
  ax.set(xlabel='step', ylabel='training loss', title='Loss and learning rate')
  ax_lr = ax.twinx()
  if _curve(ax_lr, history, 'learning_rate', color='C1', linestyle='--'):
    ax_lr.set_ylabel('learning rate (dashed)', color='C1')

  ax = axes[0, 1]
  knn_keys = sorted({k for h in history for k in h
                     if k.startswith('online/knn')})
  for key, label in ([('online/linear_acc', 'online classifier (training batch)')]
                     + [(k, k.split('/')[1] + ' (test subset)')
                        for k in knn_keys]):
    _curve(ax, history, key, marker='.' if 'knn' in key else None,
           label=label)
  ax.set(xlabel='step', ylabel='accuracy', title='Online monitors')
  if ax.lines:
    ax.legend(fontsize='small')

  ax = axes[0, 2]
  _curve(ax, history, 'alignment', color='C2', label='alignment')
  ax.set(xlabel='step', title='Alignment and uniformity (lower is better)')
  ax.set_ylabel('alignment', color='C2')
  ax_u = ax.twinx()
  if _curve(ax_u, history, 'uniformity', color='C3', label='uniformity'):
    ax_u.set_ylabel('uniformity', color='C3')

  ax = axes[1, 0]
  reps = [r for r in ('raw_pixels', 'random_init', 'trained')
          if any(k.startswith(r + '/') for k in results)]
  knn_key = next((k.split('/', 1)[1] for k in sorted(results)
                  if k.startswith('trained/knn_weighted_top1')), None)
  shown_vals = []
  for j, (metric, label) in enumerate([(knn_key, 'kNN'),
                                       ('linear_top1', 'linear')]):
    vals = [100 * results.get(f'{r}/{metric}', float('nan')) for r in reps]
    shown_vals += [v for v in vals if np.isfinite(v)]
    ys = np.arange(len(reps)) + (j - 0.5) * 0.38
    ax.barh(ys, vals, height=0.38, label=label)
    for y, v in zip(ys, vals):
      ax.text(v, y, f' {v:.1f}', va='center', fontsize=8)
  ax.set_yticks(range(len(reps)), reps)
  # Zoomed on the values: the gaps between representations are the point;
  # room on the right for the legend.
  lo = max(0., min(shown_vals, default=0.) - 8.)
  hi = max(shown_vals, default=90.) + 12.
  ax.set(xlim=(lo, hi), xlabel=f'{split} accuracy (%), axis from {lo:.0f}',
         title='Frozen features: trained vs baselines')
  gaps = [f'{label} {100 * (results[f"trained/{m}"] - results[f"random_init/{m}"]):+.1f}'
          for m, label in ((knn_key, 'kNN'), ('linear_top1', 'linear'))
          if f'trained/{m}' in results and f'random_init/{m}' in results]
  if gaps:
    ax.text(0.02, 0.98, 'trained - random init: ' + ', '.join(gaps),
            transform=ax.transAxes, va='top', fontsize=8,
            bbox={'facecolor': 'white', 'alpha': 0.8, 'edgecolor': 'none'})
  ax.legend(fontsize='small', loc='center right')

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


# A run that waits for its batches longer than this share of its training
# time is called input-bound in its summary.
INPUT_BOUND = 0.1


def _input_wait_lines(wait: float | None) -> list[str]:
  if wait is None:
    return []
  line = f'input wait {100 * wait:.0f}% of the training time'
  if wait < INPUT_BOUND:
    return [line]
  return [line + ': input-bound, the devices waited for batches (decoding '
          'in worker processes, config.dataset.num_workers: '
          'docs/input_pipeline.md)']


def summary(results: dict, workdir: str) -> str:
  """A one-screen text summary of a finished run."""
  rows = [n for n in ('raw_pixels', 'random_init', 'trained')
          if any(k.startswith(n + '/') for k in results)]
  knn_key = next((k.split('/', 1)[1] for k in sorted(results)
                  if k.startswith('trained/knn_weighted_top1')), None)
  lines = ['', '=' * 64,
           f'{"representation":<16}{knn_key or "knn":>26}{"linear_top1":>14}',
           '-' * 64]
  for n in rows:
    knn_v = results.get(f'{n}/{knn_key}', float('nan'))
    lin_v = results.get(f'{n}/linear_top1', float('nan'))
    lines.append(f'{n:<16}{100 * knn_v:>25.2f}%{100 * lin_v:>13.2f}%')
  if 'trained/linear_eval_top1' in results:
    label = "trained, the papers' linear evaluation"
    lines.append(f'{label:<42}'
                 f'{100 * results["trained/linear_eval_top1"]:>21.2f}%')
  if skipped := results.get('data/skipped_records'):
    lines.append(f'{skipped} undecodable images replaced in training, left '
                 'out of the scores (data/skipped_files)')
  lines += ['-' * 64,
            f'steps {results.get("steps")}, training {results.get("train_seconds")}'
            f' s, {results.get("images_per_sec", float("nan")):.0f} images/s, '
            f'final loss {results.get("final_loss", float("nan")):.4f}',
            *_input_wait_lines(results.get('input_wait')),
            f'results: {workdir}/results.json  plot: {workdir}/summary.png',
            f'TensorBoard: tensorboard --logdir {workdir}', '=' * 64]
  return '\n'.join(lines)
