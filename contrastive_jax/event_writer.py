"""TensorBoard scalars, written without importing TensorFlow.

clu's metric writers import TensorFlow with their package, seconds at the
start of every process for a run that otherwise never loads it (TFDS reads
ArrayRecord files with numpy and PIL; TensorFlow is loaded only to build a
dataset; docs/performance.md has the start-up figures). The event files here
are TensorBoard's own format, written by TensorBoard's record writer and
protos: `tensorboard --logdir <workdir>` shows them.

A resumed run redoes the steps after its checkpoint, and the events of the
invocation it resumes may already hold some of them. `EventWriter.restart`
writes TensorBoard's restart marker, an event with `session_log.status =
START`: TensorBoard's event accumulator then drops every event it has read
with a step at or after the marker's (`_CheckForRestartAndMaybePurge` in
`tensorboard/backend/event_processing/event_accumulator.py`; TensorBoard's
Rust data server replaces a series' points from any step written again).
Event files are read in the order of their names, which start with the
second they were opened in, so the marker follows what it discards.
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
  """Appends scalar summaries to event files in `logdir`.

  `logdir=None` gives a writer that writes nothing (the processes other than
  process 0 of a multi-host run). Paths go through `storage` (`etils.epath`),
  so a `gs://` workdir holds the events too. `flush` makes what is written
  so far durable: a local file is flushed; on an object store, where a file
  is one object uploaded when it is closed, the file is closed and the next
  scalars start a new one (TensorBoard reads every event file of a folder).
  """

  def __init__(self, logdir: str | os.PathLike | None):
    self._file = self._records = None
    self._dir = None if logdir is None else storage.path(logdir)
    self._remote = logdir is not None and storage.is_remote(logdir)

  def _open(self) -> None:
    self._dir.mkdir(parents=True, exist_ok=True)
    # TensorBoard's naming (`events.out.tfevents.<seconds>.<host>`), plus the
    # pid and a count of the files this process opened, so that no two files
    # share a name (two writers of one process may open theirs in the same
    # second). TensorBoard reads a folder's event files in the order of their
    # names: the count has a fixed width, so that `.10` follows `.2`.
    name = (f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}.'
            f'{os.getpid()}.{next(_FILE_COUNT):04d}')
    self._file = (self._dir / name).open('wb')
    self._records = record_writer.RecordWriter(self._file)
    self._write(event_pb2.Event(file_version='brain.Event:2'))

  def _write(self, event: event_pb2.Event) -> None:
    event.wall_time = time.time()
    self._records.write(event.SerializeToString())

  def restart(self, step: int) -> None:
    """Marks a (re)start at `step`: TensorBoard discards the events written
    before this one at steps >= `step` (the module docstring)."""
    if self._dir is None:
      return
    if self._file is None:
      self._open()
    self._write(event_pb2.Event(
        step=int(step),
        session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """One event at `step` holding each scalar as a `simple_value`."""
    if self._dir is None:
      return
    if self._file is None:
      self._open()
    self._write(event_pb2.Event(step=int(step), summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
               for tag, value in scalars.items()])))

  def flush(self) -> None:
    if self._file is None:
      return
    if self._remote:
      self.close()
    else:
      self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = self._records = None
