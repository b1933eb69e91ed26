"""benchmarks/scaling.py's figure: no two tick labels of a panel overlap."""

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from benchmarks import scaling  # pylint: disable=g-import-not-at-top


def _groups():
  # The sizes the benchmark sweeps (its FULL configuration), with values
  # growing as the expected law.
  sweeps = [('batch', [64, 128, 256, 512], 'ms'),
            ('views', [2, 4, 6], 'ms'),
            ('N*V', [512, 1024, 2048, 4096], 'ms'),
            ('Q', [4096, 8192, 16384, 32768, 65536], 'ms'),
            ('bank rows', [80_000, 160_000, 320_000, 640_000, 1_281_167], 's'),
            ('bank rows', [80_000, 160_000, 320_000, 640_000, 1_281_167],
             'MiB')]
  return [scaling.Group(f'{name} sweep', name, 1, unit, sizes,
                        [1e-3 * s for s in sizes]) for name, sizes, unit in
          sweeps]


def test_tick_labels_do_not_collide(tmp_path, monkeypatch):
  figures = []
  monkeypatch.setattr(plt.Figure, 'savefig',
                      lambda self, *a, **k: figures.append(self))
  scaling.plot(_groups(), str(tmp_path / 'scaling.png'))
  (fig,) = figures
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  checked = 0
  for ax in fig.axes:
    for axis in (ax.xaxis, ax.yaxis):
      boxes = [t.get_window_extent(renderer)
               for t in axis.get_ticklabels(which='both')
               if t.get_visible() and t.get_text()]
      checked += len(boxes)
      for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
          assert not a.overlaps(b), (ax.get_title(), a, b)
    # Every measured size is a labelled x tick.
    labels = [t.get_text() for t in ax.xaxis.get_ticklabels() if t.get_text()]
    assert len(labels) == len(ax.lines[0].get_xdata())
  assert checked > 40
