#!/usr/bin/env bash
# Runs the accelerator check, or the GPU training run, on a CUDA host with no
# network. It needs:
#   * python3 (3.12) with jax[cuda], torch and torchvision, and the packages a
#     CUDA image usually has (numpy, scipy, scikit-learn, matplotlib, pillow,
#     tensorboard, tensorstore, etils, pytest, pytest-xdist);
#   * .accel/ from `PYTHONPATH=. .venv/bin/python benchmarks/accelerator.py
#     --prepare` on a machine with the project's venv and network (the
#     Fashion-MNIST npz files and the pinned wheels), copied beside the code.
#
#   bash benchmarks/run_on_gpu.sh check OUT [accelerator.py flags...]
#   bash benchmarks/run_on_gpu.sh check OUT --preset=bn
#   bash benchmarks/run_on_gpu.sh train OUT EPOCHS [main.py flags...]
#
# check: benchmarks/accelerator.py (steps against PyTorch, main.py end to end,
#   the input pipeline); --preset=bn: only the step rows pending on a GPU
#   (peak, r50, r18 with every torch.compile mode, our variants and the XLA
#   flag rows), about 8 min (accelerator.py's docstring). train:
#   configs/simclr_resnet18_fmnist.py through main.py for EPOCHS epochs, with
#   the reference tests (accelerator.py --parts=tests) running beside it. OUT
#   receives the report, the logs (logs.tgz), for check the step rows'
#   profiles (traces.tgz) and, for train, results.json and summary.png.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=$1 out=$2
shift 2
work=/tmp/contrastive_jax_gpu
mkdir -p "$work" "$out"
out=$(cd "$out" && pwd)
PYTHON=${PYTHON:-python3}

# The pinned flax/optax/orbax/chex when they import against this host's jax,
# else the host's own; the rest (ml-collections, grain, ...) always.
# (SKIP_WHEELS=1: a machine that has them all, e.g. the project's venv.)
if [ -z "${SKIP_WHEELS:-}" ]; then
  pins='.accel/wheels/flax-* .accel/wheels/optax-* .accel/wheels/orbax_*
        .accel/wheels/chex-*'
  # shellcheck disable=SC2086
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$work/pins" $pins || exit 1
  # shellcheck disable=SC2046
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$work/extra" \
    $(ls .accel/wheels/*.whl | grep -v -e flax- -e optax- -e orbax_ -e chex-) \
    || exit 1
fi
export PYTHONPATH="$work/pins:$work/extra:$PWD"
if ! "$PYTHON" -c 'import contrastive_jax.train' 2>"$work/pins_import.log"; then
  echo "The pinned flax/optax/orbax/chex do not import here; using the host's:"
  tail -3 "$work/pins_import.log"
  export PYTHONPATH="$work/extra:$PWD"
fi
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
  --format=csv,noheader 2>/dev/null
"$PYTHON" -c 'import jax, flax, optax; print("jax", jax.__version__, "flax",
  flax.__version__, "optax", optax.__version__, jax.devices())'

case "$mode" in
  check)
    # Each part writes the report as it ends: a time-out keeps those done.
    rm -rf "$work/check"
    timeout "${CHECK_TIMEOUT:-1800}" "$PYTHON" benchmarks/accelerator.py \
      --out="$work/check" "$@" 2>&1 | tee "$work/check.log"
    cp "$work/check/accelerator.json" "$work/check.log" "$out/"
    tar czf "$out/logs.tgz" -C "$work/check" --exclude='*_trace' \
      --exclude=e2e_workdir/checkpoints . 2>/dev/null
    (cd "$work/check" && tar czf "$out/traces.tgz" ./*_trace 2>/dev/null)
    ;;
  train)
    epochs=$1
    shift
    wd="$work/simclr_resnet18_fmnist"
    rm -rf "$wd"
    start=$(date +%s)
    timeout "${TRAIN_TIMEOUT:-7200}" \
      "$PYTHON" main.py --config=configs/simclr_resnet18_fmnist.py \
      --workdir="$wd" --config.dataset.name=npz \
      --config.dataset.data_dir=.accel/fashion_mnist \
      --config.num_epochs="$epochs" --progress=off "$@" \
      > "$work/train.log" 2>&1 &
    train=$!
    "$PYTHON" benchmarks/accelerator.py --parts=tests --out="$work/tests" \
      --test_workers=4 > "$work/tests.log" 2>&1
    wait $train
    echo "main.py exited $? after $(( $(date +%s) - start )) s"
    tail -15 "$work/train.log"
    tail -8 "$work/tests.log"
    cp "$wd/results.json" "$wd/summary.png" "$work/tests/accelerator.json" \
      "$out/" 2>/dev/null
    mv "$out/accelerator.json" "$out/tests.json" 2>/dev/null
    tar czf "$out/logs.tgz" -C "$work" train.log tests.log tests \
      "simclr_resnet18_fmnist/history.json" 2>/dev/null
    ;;
  *)
    echo "usage: $0 check|train OUT [...]" >&2
    exit 2
    ;;
esac
