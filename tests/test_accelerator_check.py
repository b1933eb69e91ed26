"""The accelerator check's dry mode and its pure parts, on the CPU.

benchmarks/accelerator.py runs on a GPU host now and then; this keeps it
working in between: the ResNet-50 step rows (our step and its variant, each
built by step_lib.build from the paper config with its config overrides,
compiled, timed in alternation over the worker protocol, profiled, its cost
analysis read), the input-rate part and main.py streamed end to end, at tiny
sizes. The PyTorch peer rows need torch, which the project does not install:
without it they are reported absent, not failed. The kernel classification
by launcher, the config overrides, the waves and the flag rows' names are
checked on synthetic inputs.
"""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import accelerator as acc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_dry_run_reports_every_part(tmp_path):
  env = dict(os.environ, XLA_FLAGS='', PYTHONPATH=ROOT)
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'benchmarks', 'accelerator.py'),
       '--dry', '--parts=peak,r50,input,stream', f'--out={tmp_path}',
       f'--cache_dir={tmp_path / "cache"}', '--torch_python='],
      capture_output=True, text=True, env=env, check=False, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads((tmp_path / 'accelerator.json').read_text())
  assert report['dry'] and report['backend'] == 'cpu'
  r50 = report['r50']
  assert r50['peer'] == 'no torch interpreter'
  assert set(r50['rows']) == set(acc.OUR_VARIANTS)   # No flag rows dry.
  for name, overrides in acc.OUR_VARIANTS.items():
    row = r50['rows'][name]
    assert row['overrides'] == overrides, name
    assert len(row['step_ms_rounds']) == r50['spec']['rounds'] == 2
    assert row['images_per_s'] > 0 and row['step_ms'] > 0
    # XLA:CPU's thunks stand for the kernels: each by its HLO op.
    kinds = row['profile']['by_kind_ms_per_step']
    assert kinds.get('XLA fusion', 0) > 0, row['profile']
  # ResNet-50 at 32 px: the forward is 4.1 GMAC at 224 px scaled by
  # (32 / 224)^2, so forward + backward (3x) is ~0.5 GFLOP per view.
  assert 0.35e9 < r50['flops_per_image_fwd_bwd'] < 0.65e9
  inp = report['input']['cells']['1']
  for row in ('ours_processes', 'ours_threads', 'ours_center_square'):
    assert inp[row][0]['images_per_s'] > 0, row
  assert 'worker processes' in inp['ours_processes'][0]['decoding']
  assert 'threads of the training process' in (
      inp['ours_threads'][0]['decoding'])
  assert 'no torch interpreter' in inp['peer_host_crops'][0]['error']
  assert set(report['input']['per_image']) == {
      f'{d} | {f}' for d in ('PIL, full size', 'PIL, reduced',
                             'libjpeg-turbo API, full size',
                             'libjpeg-turbo API, reduced (ours)')
      for f in ('center_square', 'full_image')}
  # main.py end to end, streamed and from memory, with the input wait.
  st = report['stream']
  for run in ('streamed', 'arrayrecord', 'memory'):
    assert st[run]['images_per_s'] > 0 and 0 <= st[run]['input_wait'] <= 1
    assert st[run]['intervals'], run
  assert 'image_folder' in st['streamed']['command']
  assert 'dataset.name=imagenet_like' in st['arrayrecord']['command']
  assert st['peer_error'] == 'no torch interpreter'
  assert 'stream  main.py ResNet-50 SimCLR' in proc.stdout
  assert 'r50     ours           batch 4' in proc.stdout
  assert 'r50     ours_flax_bn   kernel ms/step: XLA fusion' in proc.stdout


HLO = r"""HloModule jit_step, is_scheduled=true

%fused_convert (param_0: bf16[8,8]) -> f32[8,8] {
  %param_0 = bf16[8,8]{1,0} parameter(0)
  ROOT %convert.1 = f32[8,8]{1,0} convert(%param_0)
}

%command_buffer (p: f32[8,8]) -> f32[8,8] {
  %p = f32[8,8]{1,0} parameter(0)
  %loop_add_fusion.2 = f32[8,8]{1,0} fusion(%p), kind=kLoop, calls=%fused_convert
  ROOT %cublas-gemm.3 = (f32[8,8]{1,0}, s8[0]{0}) custom-call(%p, %p), custom_call_target="__cublas$gemm"
}

ENTRY %main.9 (a: bf16[8,8], b: bf16[8,8]) -> f32[8,8] {
  %custom-call.1 = (bf16[8,8]{1,0}, u8[0]{0}) custom-call(%a, %b), window={size=1x1}, custom_call_target="__cudnn$convBackwardInput", backend_config={"cudnn_conv_backend_config":{"activation_mode":"kNone"}}
  %cublas-lt-matmul.2 = (bf16[8,8]{1,0}, s8[0]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul"
  %gemm_fusion_dot.3 = bf16[8,8]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm, backend_config={"operation_queue_id":"0","fusion_backend_config":{"kind":"__triton_gemm","triton_gemm_config":{"block_m":"64"}}}
  %cudnn-fusion.4 = bf16[8,8]{1,0} fusion(%a, %b), kind=kCustom, calls=%c, backend_config={"fusion_backend_config":{"kind":"__cudnn$fusion"}}
  %cutlass_gemm.5 = bf16[8,8]{1,0} fusion(%a, %b), kind=kCustom, calls=%d, backend_config={"fusion_backend_config":{"kind":"__custom_fusion","custom_fusion_config":{"name":"cutlass_gemm"}}}
  %input_reduce_convolution_fusion = f32[8,8]{1,0} fusion(%a), kind=kInput, calls=%fused_convert
  %call.6 = f32[8,8]{1,0} call(%a), to_apply=%command_buffer
  ROOT %sort.7 = f32[8,8]{1,0} custom-call(%call.6), custom_call_target="__gpu$xla.gpu.ext.cub_sort"
}
"""


def test_xla_kernels_by_the_op_that_launched_them():
  def k(name, **args):
    return {'name': name, 'ms': 1.0, 'args': args}
  kernels = [
      k('sm90_xmma_dgrad_implicit_gemm_bf16', hlo_op='custom-call.1'),
      k('nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT',
        hlo_op='cublas-lt-matmul.2'),
      k('gemm_fusion_dot_3', hlo_op='gemm_fusion_dot.3'),
      k('cudnn_generated_fort_native_sdpa', hlo_op='cudnn-fusion.4'),
      k('cutlass_kernel', hlo_op='cutlass_gemm.5'),
      # Named like a convolution, launched by a fusion: an XLA fusion.
      k('input_reduce_convolution_fusion',
        hlo_op='input_reduce_convolution_fusion'),
      # In a command buffer: the member named like the kernel, else none.
      k('loop_add_fusion_2', hlo_op='call.6'),
      k('sm90_gemm_from_the_buffer', hlo_op='call.6'),
      # The op in an annotation rather than its own stat.
      k('nvjet_hsh_64x8', long_name='Thunk:#name=dot,hlo_op=cublas-lt-'
        'matmul.2#'),
      k('DeviceRadixSortOnesweepKernel', hlo_op='sort.7'),
      k('no_op_named'), k('other_module', hlo_op='fusion.999')]
  rows = acc.classify_xla_kernels(kernels, HLO)
  assert [kind for _, kind, _ in rows] == [
      'cuDNN', 'cuBLAS', 'XLA Triton', 'cuDNN', 'CUTLASS', 'XLA fusion',
      'XLA fusion', 'unattributed', 'cuBLAS', 'other', 'unattributed',
      'unattributed']
  table = acc.kernel_table(rows, steps=2)
  assert table['gpu_ms_per_step'] == 6.0
  assert table['by_kind_ms_per_step']['unattributed'] == 1.5
  assert [n for n, _ in table['unattributed_ms_per_step']] == [
      'sm90_gemm_from_the_buffer', 'no_op_named', 'other_module']


def _torch_trace():
  """A torch.profiler chrome trace's events: CPU operators on two threads
  (the forward's and autograd's), their launches, the kernels."""
  events = []

  def op(name, ts, dur, tid=1, cat='cpu_op'):
    events.append({'ph': 'X', 'cat': cat, 'name': name, 'pid': 1,
                   'tid': tid, 'ts': ts, 'dur': dur, 'args': {}})

  def launch(corr, ts, tid=1, name='cudaLaunchKernel', cat='cuda_runtime'):
    events.append({'ph': 'X', 'cat': cat, 'name': name, 'pid': 1,
                   'tid': tid, 'ts': ts, 'dur': 1,
                   'args': {'correlation': corr}})

  def kernel(name, corr, dur=1000., cat='kernel'):
    events.append({'ph': 'X', 'cat': cat, 'name': name, 'pid': 0, 'tid': 7,
                   'ts': 10_000 + corr, 'dur': dur,
                   'args': {'correlation': corr}})

  op('Torch-Compiled Region: 0/0', 0, 1000, cat='user_annotation')
  op('## Call CompiledFxGraph fabc ##', 1, 900, cat='user_annotation')
  op('aten::convolution', 10, 100)
  op('aten::_convolution', 11, 98)
  op('aten::cudnn_convolution', 12, 96)
  launch(1, 20)
  kernel('sm90_xmma_fprop_implicit_gemm_bf16bf16', 1)
  # Inductor's kernel named after a convolution's backward: Triton.
  name = ('triton_poi_fused__native_batch_norm_legit_functional_add_'
          'convolution_backward_0')
  op(name, 200, 10)
  launch(2, 202, name='cuLaunchKernelEx', cat='cuda_driver')
  kernel(name, 2)
  op('aten::addmm', 300, 20)
  launch(3, 305)
  kernel('nvjet_tst_128x64_64x8_1x2_h_bz_coopA_TNN', 3)
  # The backward on autograd's thread: a convolution's backward (cuDNN)
  # holding an ATen copy of its own (other).
  op('CompiledFunctionBackward', 0, 2000, tid=2)
  op('aten::convolution_backward', 50, 100, tid=2)
  launch(4, 60, tid=2)
  kernel('sm90_xmma_wgrad_implicit_gemm_bf16', 4)
  op('aten::copy_', 120, 10, tid=2)
  launch(5, 125, tid=2)
  kernel('elementwise_kernel_copy', 5)
  op('Optimizer.step#SGD.step', 3000, 100, cat='user_annotation')
  op('aten::_fused_sgd_', 3001, 90)
  launch(6, 3010)
  kernel('FusedSgdMathFunctor', 6)
  kernel('Memcpy DtoD (Device -> Device)', 7, cat='gpu_memcpy')
  kernel('lost_kernel', 8)            # No launch in the trace.
  launch(9, 5000, name='cudaGraphLaunch')
  kernel('nvjet_tst_128x64_64x8_1x2_h_bz_coopA_TNN', 9)   # Replayed.
  kernel('triton_red_fused_replayed', 9)
  return events


def test_torch_kernels_by_the_operator_around_their_launch():
  rows, learned = acc.classify_torch_kernels(_torch_trace())
  assert [kind for _, kind, _ in rows] == [
      'cuDNN', 'inductor Triton', 'cuBLAS', 'cuDNN', 'other', 'other',
      'other', 'unattributed', 'cuBLAS', 'unattributed']
  assert learned['nvjet_tst_128x64_64x8_1x2_h_bz_coopA_TNN'] == 'cuBLAS'
  # A CUDA graph's kernels take the kind another trace's launch gave them.
  rows, _ = acc.classify_torch_kernels(
      _torch_trace(), known={'triton_red_fused_replayed': 'inductor Triton'})
  assert rows[-1][1] == 'inductor Triton'
  assert acc.kernel_table(rows, 1)['by_kind_ms_per_step']['cuDNN'] == 2.0


def test_variant_overrides_set_existing_fields_only():
  spec = acc.step_spec('r18', dry=True)
  config = acc.our_config(spec, {'model.head_hidden_dim': 64,
                                 'optimizer.momentum': 0.5})
  assert config.model.head_hidden_dim == 64
  assert config.optimizer.momentum == 0.5
  assert acc.our_config(spec).model.head_hidden_dim == spec['hidden']
  with pytest.raises(KeyError, match='model.no_such_field'):
    acc.our_config(spec, {'model.no_such_field': False})


def test_waves_fill_the_memory_in_order():
  rows_of, pack = acc._rows, acc._pack  # pylint: disable=protected-access
  specs = {p: acc.step_spec(p, dry=False) for p in ('r50', 'r18')}

  class Args:
    torch_python, peer_modes, flags = 'python', list(acc.PEER_MODES), None
    variants = list(acc.OUR_VARIANTS)

  rows = rows_of(['r50', 'r18'], specs, Args)
  names = [f'{r.part} {r.name}' for r in rows]
  r50_first = ['r50 peer_max-autotune-no-cudagraphs', 'r50 peer_default',
               'r50 ours', 'r50 ours_flax_bn']
  assert names[:4] == r50_first
  # An H200's budget (131 GiB): r50's modes without CUDA graphs and both
  # variants (4 x 25 GiB), r18's rows (4 GiB each) but two flag rows; the
  # r50 CUDA-graph modes wait for their siblings, r50's flag rows for room.
  wave = pack(rows, rows, free=131.)
  assert [f'{r.part} {r.name}' for r in wave] == r50_first + [
      n for n in names if n.startswith('r18')][:7]
  for row in rows:
    row.state = 'live' if row in wave else row.state
    if row.part == 'r18' or row.name == 'peer_default':
      row.state = 'ended'   # r18 done; the slower r50 mode ended.
  pending = [r for r in rows if r.state == 'pending']
  live = sum(r.share for r in rows if r.state == 'live')
  wave = pack(pending, rows, free=131. - live)
  assert [r.name for r in wave] == ['peer_max-autotune',
                                    'peer_reduce-overhead']


@pytest.mark.parametrize('good', [True, False])
def test_flag_rows_name_flags_jaxlib_has(good):
  flags = ' '.join(acc.XLA_FLAG_ROWS.values()) if good else (
      '--xla_gpu_no_such_flag_here=true')
  proc = subprocess.run(
      [sys.executable, '-c', 'import jax; jax.jit(lambda x: x + 1)(1.)'],
      env=dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS='cpu'),
      capture_output=True, text=True, check=False, timeout=120)
  assert (proc.returncode == 0) == good, proc.stderr[-1000:]
