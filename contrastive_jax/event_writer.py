"""TensorBoard scalars, written without importing TensorFlow.

Event files in TensorBoard's own format, via its record writer and protos.
`EventWriter.restart` writes TensorBoard's restart marker (`session_log`
START): TensorBoard then drops the events it read at or after that step, so
a resumed run's redone steps show once.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from typing import Mapping

from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.summary.writer import record_writer

from contrastive_jax import storage

# The event files this process has opened: the last part of their names.
_FILE_COUNT = itertools.count()


class EventWriter:
  """Appends scalar summaries to event files in `logdir` (None: writes
  nothing). `flush` makes them durable; on an object store it closes the
  file (one object) and the next scalars start a new one.
  """

  def __init__(self, logdir: str | os.PathLike | None):
    self._file = self._records = None
    self._dir = None if logdir is None else storage.path(logdir)
    self._remote = logdir is not None and storage.is_remote(logdir)

  def _write(self, event: event_pb2.Event) -> None:
    if self._dir is None:
      return
    if self._file is None:
      self._dir.mkdir(parents=True, exist_ok=True)
      # TensorBoard's naming plus pid and a fixed-width count: unique names,
      # read in the order they were opened.
      name = (f'events.out.tfevents.{int(time.time())}.'
              f'{socket.gethostname()}.{os.getpid()}.{next(_FILE_COUNT):04d}')
      self._file = (self._dir / name).open('wb')
      self._records = record_writer.RecordWriter(self._file)
      self._write(event_pb2.Event(file_version='brain.Event:2'))
    event.wall_time = time.time()
    self._records.write(event.SerializeToString())

  def restart(self, step: int) -> None:
    """Marks a (re)start: TensorBoard drops earlier events at steps >= it."""
    self._write(event_pb2.Event(
        step=int(step),
        session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """One event at `step` holding each scalar as a `simple_value`."""
    self._write(event_pb2.Event(step=int(step), summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
               for tag, value in scalars.items()])))

  def flush(self) -> None:
    if self._remote:
      self.close()
    elif self._file is not None:
      self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = self._records = None
