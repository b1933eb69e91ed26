"""TensorBoard scalars, written without importing TensorFlow.

clu's metric writers import TensorFlow with their package, seconds at the
start of every process for a run that otherwise never loads it (TFDS reads
ArrayRecord files with numpy and PIL; TensorFlow is loaded only to build a
dataset; docs/performance.md has the start-up figures). The event files here
are TensorBoard's own format, written by TensorBoard's record writer and
protos: `tensorboard --logdir <workdir>` shows them.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Mapping

from etils import epath
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.summary.writer import record_writer


class EventWriter:
  """Appends scalar summaries to one event file in `logdir`.

  `logdir=None` gives a writer that writes nothing (the processes other than
  process 0 of a multi-host run). Paths go through `etils.epath`, so a
  `gs://` workdir works where TensorFlow or gcsfs is installed.
  """

  def __init__(self, logdir: str | os.PathLike | None):
    self._file = self._records = None
    if logdir is None:
      return
    path = epath.Path(logdir)
    path.mkdir(parents=True, exist_ok=True)
    # TensorBoard's naming (`events.out.tfevents.<seconds>.<host>`), plus the
    # pid so that two writers started in the same second never share a file.
    name = (f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}.'
            f'{os.getpid()}')
    self._file = (path / name).open('wb')
    self._records = record_writer.RecordWriter(self._file)
    self._write(event_pb2.Event(file_version='brain.Event:2'))

  def _write(self, event: event_pb2.Event) -> None:
    event.wall_time = time.time()
    self._records.write(event.SerializeToString())

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """One event at `step` holding each scalar as a `simple_value`."""
    if self._records is None:
      return
    self._write(event_pb2.Event(step=int(step), summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
               for tag, value in scalars.items()])))

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = self._records = None
