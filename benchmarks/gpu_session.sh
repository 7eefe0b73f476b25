#!/bin/bash
# One GPU session on a machine without a compiler: install the wheels, unpack
# a build cache made here, then the GPU tests, a profile of the per-call path
# and the whole CUDA benchmark, writing everything under $OUT.
#
#   pip wheel --no-deps -w .whl . && pip download --no-deps -d .whl nvidia-cutlass threadpoolctl
#   DISPATCHER_CACHE_DIR=.carry/cache python benchmarks/build_cuda.py --set all --pack .carry/pack/cache.tar.xz
#   OUT=/some/dir bash benchmarks/gpu_session.sh      # on the GPU machine
set -u
R=$PWD
WHEELS=${WHEELS:-.whl} CACHE=${CACHE:-.carry/pack/cache.tar.xz} SHAPES=${SHAPES:-.carry/pack/shapes.json}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $WHEELS/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 GEMM_SHAPES=$R/$SHAPES
mkdir -p /tmp/cache && tar -xJf $CACHE -C /tmp/cache
export DISPATCHER_CACHE_DIR=/tmp/cache DISPATCHER_TEST_CACHE_DIR=/tmp/cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
timeout 200 python3 -m pytest -q --tb=short -m gpu -p no:cacheprovider tests/test_cuda_gpu.py 2>&1 \
    | tee $OUT/gpu_tests.log | tail -3
(cd /tmp && timeout 60 python3 $R/benchmarks/profile_call.py) 2>&1 | tee $OUT/profile_call.log | head -45
timeout 300 python3 benchmarks/cuda_gemm.py --out $OUT/bench 2>&1 | tail -32
