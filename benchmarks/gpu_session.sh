#!/bin/bash
# One GPU session on the H200 machine (nvcc there, nothing downloadable):
#
#   git archive HEAD | tar -x -C /tmp/clean && pip wheel --no-deps -w .whl /tmp/clean
#   pip download --no-deps -d .whl nvidia-cutlass==4.2.0.0 nvidia-matmul-heuristics
#   cp ../shared/bench/shapes.json .carry/pack/shapes.json
#   OUT=/some/dir bash benchmarks/gpu_session.sh build test    # on the GPU machine
#   OUT=/some/dir bash benchmarks/gpu_session.sh bench
#   OUT=/some/dir bash benchmarks/gpu_session.sh torchbuild torchtest torchbench   # dispatcher.torch
#
# build: the catalogs and the GPU tests' kernels, in parallel, into .gpucache
# (kept on a warm machine between calls); pack: that cache into
# $OUT/cache.tar.xz.part-*; unpack: it back from .carry/pack/cache.tar.xz.part-* on a fresh
# machine; test: the GPU tests; bench: the CUDA benchmark; torchbuild,
# torchtest, torchbench: the same for dispatcher.torch (TORCH_BENCH_ARGS=--autotune
# to tune the MLP's six GEMMs in the warm-up); batchedtest: the batched and
# epilogue GPU tests; alltests: every GPU test file in one run (TEST_K: a -k
# expression to run some); unaligned: the unaligned and skinny parts of the CUDA
# benchmark; overhead: benchmarks/call_overhead.py's GPU part; cpubench, cpucall: the
# host CPU's benchmarks (cpu_gemm.py; call_overhead.py's CPU parts); cpuepilogue: its fused
# GEMM + bias + activation against numpy's unfused (epilogue_cpu.py, needs scipy); bundle:
# everything under $OUT as one results.tar.gz (last: at most 8 files come back). Everything it
# prints and writes lands under $OUT.
set -u
R=$PWD
WHEELS=${WHEELS:-.whl} SHAPES=${SHAPES:-.carry/pack/shapes.json}
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEELS/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 GEMM_SHAPES=$R/$SHAPES
export DISPATCHER_CACHE_DIR=$R/.gpucache DISPATCHER_TEST_CACHE_DIR=$R/.gpucache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
for step in "$@"; do
  case $step in
    build) timeout ${BUILD_TIMEOUT:-400} python3 benchmarks/build_cuda.py --set ${BUILD_SET:-all} --jobs $(nproc) 2>&1 | tail -15 | tee $OUT/build.log ;;
    # in parts of 15 MiB: files that come back from the machine are at most 16 MiB each
    pack) XZ_OPT=-T0 tar -cJ -C $R/.gpucache kernels | split -b 15M - $OUT/cache.tar.xz.part- && ls -la $OUT ;;
    unpack) mkdir -p $R/.gpucache && cat $R/.carry/pack/cache.tar.xz.part-* | tar -xJ -C $R/.gpucache ;;
    test)  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q --tb=short -o addopts= -m gpu -p no:cacheprovider tests/test_cuda_gpu.py 2>&1 \
             | tee $OUT/gpu_tests.log | tail -25 ;;
    bench) timeout 560 python3 benchmarks/cuda_gemm.py --out $OUT/bench 2>&1 | tee $OUT/bench.log | tail -60 ;;
    # the shapes that break TMA's alignment and the skinny ones (issue 22's staging, issue 23's M <= 64)
    unaligned) timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/cuda_gemm.py --only unaligned,skinny --out $OUT/unaligned 2>&1 \
             | tee $OUT/unaligned.log | tail -30 ;;
    # dispatcher.torch (issue 16): the kernels its GPU tests and MLP benchmark select, the tests, the benchmark
    torchbuild) timeout ${BUILD_TIMEOUT:-400} python3 benchmarks/build_cuda.py --set torch --jobs $(nproc) 2>&1 | tail -5 | tee $OUT/torch_build.log ;;
    torchtest) timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q --tb=short -o addopts= -m gpu -p no:cacheprovider tests/test_torch_gpu.py 2>&1 \
             | tee $OUT/torch_gpu_tests.log | tail -25 ;;
    # every GPU test file in one pytest run
    alltests) timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q --tb=short -o addopts= -m gpu -p no:cacheprovider \
             ${TEST_K:+-k} ${TEST_K:+"$TEST_K"} tests/test_cuda_gpu.py tests/test_batched_gpu.py tests/test_torch_gpu.py 2>&1 | tee $OUT/all_gpu_tests.log | tail -25 ;;
    batchedtest) timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q --tb=short -o addopts= -m gpu -p no:cacheprovider tests/test_batched_gpu.py 2>&1 \
             | tee $OUT/batched_gpu_tests.log | tail -25 ;;
    # where a call's host time goes (cProfile of gemm, a held plan, dispatcher.torch.gemm)
    profile) timeout 200 python3 benchmarks/profile_call.py > $OUT/profile_call.log 2>&1; tail -5 $OUT/profile_call.log ;;
    # per-call cost against torch (issue 22)
    overhead) timeout 400 python3 benchmarks/call_overhead.py --only gpu_call --out $OUT/call_overhead 2>&1 \
             | tee $OUT/call_overhead.log | tail -30 ;;
    # the GPU host's CPU (issue 25, issue 22's coexisting threads on more cores): cpu_gemm.py (CPU_ARGS:
    # more of its arguments, e.g. "--best --shapes 512x512x512,1024x1024x1024"), then
    # call_overhead.py's CPU parts
    cpubench) timeout ${CPU_TIMEOUT:-400} python3 benchmarks/cpu_gemm.py --dtypes ${CPU_DTYPES:-fp32,bf16,int8} --repeat 7 ${CPU_ARGS:-} \
             --out $OUT/cpu_gemm_host 2>&1 | tee $OUT/cpu_gemm.log | tail -25 ;;
    cpucall) timeout ${CPU_TIMEOUT:-400} python3 benchmarks/call_overhead.py --only cpu_call,cpu_coexist \
             --out $OUT/call_overhead_cpu_host 2>&1 | tee $OUT/call_overhead_cpu.log | tail -12 ;;
    cpuepilogue) timeout ${CPU_TIMEOUT:-400} python3 benchmarks/epilogue_cpu.py --out $OUT/epilogue_cpu_host 2>&1 \
             | tee $OUT/epilogue_cpu.log | tail -12 ;;
    torchbench) timeout 560 python3 benchmarks/torch_mlp.py --repeat 30 ${TORCH_BENCH_ARGS:-} --out $OUT/torch_mlp 2>&1 | tee $OUT/torch_mlp.log | tail -30 ;;
    # the shipped tuning database (dispatcher/data/tuning): the tile engine's catalog sweeps, one per
    # TUNE_SPECS entry variant:dtype:layout:grid[:out_dtype] (out_dtype: e.g. bf16 for fp8 as torch._scaled_mm
    # returns it; default CK's rule, fp8 -> fp16) (grid: benchmarks/sweeps/<grid>.json; the default is
    # the sm_90a.json of this repository; benchmarks/sweeps/cuda_tuning_specs_full.txt adds fp16, crr
    # and fp8: build them first with BUILD_SET=tune), exported with the GPU's name; TUNE_SWEEP names
    # another sweep file (catalog_raster.json: each catalog kernel in both raster orders too;
    # catalog_splitk.json: its cooperative kernels with K split in 2, 4 and 8 too, BUILD_SET=splitk;
    # catalog_hybrid.json: those and its cooperative kernels in the hybrid decomposition, BUILD_SET=hybrid;
    # catalog_bias_gelu.json: the catalog with a fused column bias and GELU, timed on that fused problem
    # (regular specs only: TUNE_SPECS="regular:bf16:rcr:cuda_tuning_grid ..."; stream_k has no epilogue);
    # grid cuda_tuning_grid_mid: mid-size shapes between the main grid's powers of two; cuda_tuning_mlp:
    # torch_mlp.py's grid's forward (rcr) and dX (rrr) GEMMs, tokens x out x in, and cuda_tuning_mlp_dw its
    # dW (crr) GEMMs, out x in x tokens); TUNE_KEEP=1
    # adds to the database of an earlier tune step on the same machine (sweeps split over calls)
    tune) [ -n "${TUNE_KEEP:-}" ] || rm -f $R/.gpucache/tuning.sqlite $R/.gpucache/tuning.sqlite-wal $R/.gpucache/tuning.sqlite-shm
          for spec in ${TUNE_SPECS:-regular:bf16:rcr:cuda_tuning_grid regular:bf16:rrr:cuda_tuning_grid stream_k:bf16:rcr:cuda_tuning_grid_stream_k}; do
            IFS=: read variant dtype layout grid out_dtype <<< "$spec"
            timeout -s INT -k 20 ${TUNE_TIMEOUT:-150} python3 -m dispatcher sweep benchmarks/sweeps/${TUNE_SWEEP:-catalog.json} --target cuda --dtype $dtype \
              ${out_dtype:+--out-dtype $out_dtype} --variant $variant --layout $layout --problems benchmarks/sweeps/$grid.json --repeat ${TUNE_REPEAT:-15} \
              --out $R/.gpucache/sweeps/$variant-$dtype${out_dtype:+-$out_dtype}-$layout-$grid${TUNE_SWEEP:+-${TUNE_SWEEP%.json}} --quiet 2>&1 | tail -3 | tee -a $OUT/tune.log
          done
          python3 -m dispatcher export-tuning $OUT/$(python3 -c "from dispatcher.targets import get; print(get('cuda').arch_id())").json \
            --about "catalog sweeps on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1): bash benchmarks/gpu_session.sh tune (gemm-dispatcher sweep benchmarks/sweeps/${TUNE_SWEEP:-catalog.json} --target cuda --repeat ${TUNE_REPEAT:-15}; TUNE_SPECS ${TUNE_SPECS:-default})" \
            | tee -a $OUT/tune.log
          # every measurement of the sweeps so far, for selection's regret computed offline
          tar -czf $OUT/sweeps.tar.gz -C $R/.gpucache sweeps ;;
    # everything under $OUT in one file (at most 8 files come back from the machine)
    bundle) (cd $OUT && tar -czf results.tar.gz --exclude results.tar.gz . && find . -type f ! -name results.tar.gz -delete) ;;
    *) echo "unknown step $step" ; exit 2 ;;
  esac
done
