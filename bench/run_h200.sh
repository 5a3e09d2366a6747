#!/usr/bin/env bash
# Every GPU measurement of SPLASH on a lent H200 machine, in one command:
#
#   bash bench/run_h200.sh [SECTION ...]      (default: all sections, in this order)
#
# Sections: calibrate kernels runtime switch engine kda conformance hostprof trace transport peer interference
# serve graphs decode theta fp8 expanded forms overlap graphmem sampling dsa fp8gemm roofline servefp8
# (peer onwards need one GPU only: the cuda backend's peer memory between two processes, how
# much page copies by kernels or by memcpy slow a step beside them, sglang.bench_serving against
# splash serve on the real-widths checkpoint, which needs the wheels of bench/serve_wheels.sh
# ($SERVE_ARGS adds options to bench/serve_bench.py, e.g. SERVE_ARGS="--layers 4"), decode graphs and
# a decode step eager vs replayed, θ from the device-bound runtime beside the steps it must predict) ($SWITCH_BUDGET and
# $ENGINE_BUDGET set how long those two benchmarks may keep starting runs; $SWITCH_ARGS adds options and
# $SWITCH_TAG names the run, so A/Bs in one call keep apart: SWITCH_TAG=-pulls
# SWITCH_ARGS="--transfer peer_pulls=true", or SWITCH_TAG=-flat SWITCH_ARGS="--transfer peer_pulls=true
# --transfer pitched_pulls=false"). Each runs under its own
# time limit, writes its results under $RES/<section>/<platform>/ and is packed into
# $OUT/<section>.tgz as soon as it ends, so a later section that overruns loses nothing.
# Unpack with `tar xzf <section>.tgz` and copy the JSON into bench/results/<platform>/.
#
# The machine has no network: carry fla-core's and pluggy's wheels in .whl/ (see README).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
export SPLASH_GIT_COMMIT="${SPLASH_GIT_COMMIT:-unknown}"
OUT="${OUT:-/tmp/splash-out}"
RES="${RES:-/tmp/splash-res}"
SWITCH_BUDGET="${SWITCH_BUDGET:-180}"  # seconds of measuring the switch and engine benchmarks may start
ENGINE_BUDGET="${ENGINE_BUDGET:-170}"
mkdir -p "$OUT" "$RES"
cd "$(dirname "$0")/.."

python3 -m pip install -q --no-deps --no-build-isolation $(ls .whl/*.whl 2>/dev/null) \
  -e . -e bench -e backends/cuda -e backends/hopper -e backends/dcu 2>&1 | grep -v WARN | tail -2

section() {  # name, time limit (s), command...
  local name=$1 limit=$2
  shift 2
  mkdir -p "$RES/$name"
  echo "== $name (limit ${limit}s): $*"
  local start=$SECONDS
  timeout "$limit" "$@" >"$RES/$name/log.txt" 2>&1
  echo "   exit $? after $((SECONDS - start))s"
  tail -n 25 "$RES/$name/log.txt"
  tar czf "$OUT/$name.tgz" -C "$RES" "$name"
}

sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(calibrate kernels runtime switch engine kda conformance)
for s in "${sections[@]}"; do
  case $s in
    calibrate) section calibrate 120 splash calibrate --backend hopper --ranks 2 --out "$RES/calibrate/h200.yaml"
               # later sections (the engine's scheduler) use the θ this run just measured
               cp "$RES/calibrate/h200.yaml" profiles/hardware/h200.yaml 2>/dev/null ;;
    kernels) section kernels 240 python3 bench/gpu_kernels.py --out "$RES/kernels" --sections sweep,correctness,decode,prefill
             # later sections use the tiles this run just chose
             cp "$RES/kernels/hopper-tuned-h200.json" backends/hopper/splash_backend_hopper/tuned/h200.json 2>/dev/null ;;
    runtime) section runtime 150 python3 bench/runtime_step.py --out "$RES/runtime" --budget-s 70 ;;
    switch) section "switch${SWITCH_TAG:-}" $((SWITCH_BUDGET + 80)) python3 bench/switch_bench.py \
              --out "$RES/switch${SWITCH_TAG:-}" --budget-s "$SWITCH_BUDGET" ${SWITCH_ARGS:-} ;;
    engine) section engine $((ENGINE_BUDGET + 110)) python3 bench/engine_bench.py --out "$RES/engine" --budget-s "$ENGINE_BUDGET" ;;
    kda) section kda 240 python3 bench/kda_runtime.py --out "$RES/kda" ;;
    conformance) section conformance 200 python3 bench/gpu_kernels.py --out "$RES/conformance" --sections conformance ;;
    # where the host time of a step and of a switch goes on the GPUs (tiny widths, real page counts)
    hostprof) section hostprof 240 bash -c "python3 bench/runtime_host_profile.py --out $RES/hostprof --platform h200x2 \
                 --backend hopper --kernels backend --rounds 1 --profile-out $RES/hostprof/runtime_profile.txt &&
               python3 bench/switch_host_profile.py --out $RES/hostprof --platform h200x2 --backend hopper \
                 --kernels backend --runs 3 --directions TP-CP,CP-TP,TP-DP,DP-TP,TP-DOP,CP-DP" ;;
    # why a switching step is slower than the ready one: profiler traces ($TRACE_VARIANTS: see the script)
    trace) section trace 420 python3 bench/switch_trace.py --out "$RES/trace" --trace-dir "$RES/trace/raw" \
             --directions "${TRACE_DIRECTIONS:-TP-CP,CP-TP,CP-DOP}" --variants "${TRACE_VARIANTS:-base}" --timed-runs 5 ;;
    # NCCL's kernels vs copy engines for one layer's collectives, alone and beside matmuls
    transport) section transport 200 python3 bench/transport_probe.py --out "$RES/transport" --timeout-s 150 ;;
    peer) section peer 180 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_peer_memory.py ;;
    interference) section interference 300 python3 bench/copy_interference.py --out "$RES/interference" ;;
    serve) section serve 470 python3 bench/serve_bench.py --out "$RES/serve" --budget-s 330 ${SERVE_ARGS:-} ;;
    # decode graphs (one GPU): replay equals eager in every layout, and the fused ops and graph ops conform
    graphs) section graphs 300 bash -c "python3 -m pytest -q -p no:cacheprovider tests/test_cuda_graphs.py &&
              python3 -m pytest -q -p no:cacheprovider --pyargs splash_core.testing --splash-backend hopper \
                --splash-ranks 1 -k 'fused or graph_ops'" ;;
    # a decode step eager vs replayed from its graph, B = 1/16/64 at 8K/32K/128K, beside its roofline (one GPU)
    decode) section decode 330 python3 bench/decode_step.py --out "$RES/decode" --budget-s "${DECODE_BUDGET:-240}" ;;
    # θ from the device-bound runtime (splash calibrate --graphs auto) and, in the same run, a replayed decode step
    # and an eager prefill chunk per layout at B = 1/16/64, 8K/32K/128K, T = 1 (one GPU): what
    # bench/costmodel_check.py --measured theta/h200/runtime_step-t1.json predicts
    theta) section theta 420 python3 bench/runtime_step.py --T 1 --batches 1,16,64 --reps 5 --warmup 2 --budget-s 200 \
             --calibrate --skip-equivalence --name runtime_step-t1 --out "$RES/theta" ;;
    # FP8 KV (one GPU): the Triton kernels and FlashMLA's fp8 decode on the scaled cache against the
    # reference, the conformance suite's fp8 cases, splash run end to end, then the peer kernels in bf16 and fp8
    fp8) section fp8 560 bash -c "python3 -m pytest -q -p no:cacheprovider -rs tests/test_gpu_fp8_kv.py;
           python3 -m pytest -q -p no:cacheprovider --pyargs splash_core.testing --splash-backend hopper \
             --splash-ranks 1 -k 'fp8';
           splash run --deployment h200-tiny-fp8kv --json | tail -c 600;
           python3 bench/peer_kernels.py --out $RES/fp8 ${PEER_ARGS:---quick}" ;;
    # prefill in the expanded form (one GPU): the kernel and a model in each form against the reference, the
    # conformance suite's MLA cases, Triton's rate beside the matmul's and the SDPA providers' (cuDNN), and
    # the per-shape choice they would make (providers.json's expanded entry: commit it only where a served
    # run gains, since cuDNN builds a graph per new shape)
    expanded) section expanded 420 bash -c "python3 -m pytest -q -p no:cacheprovider -rs tests/test_gpu_expanded.py \
                 tests/test_sdpa_expanded_gpu.py;
               python3 -m pytest -q -p no:cacheprovider --pyargs splash_core.testing --splash-backend hopper \
                 --splash-ranks 1 -k 'mla';
               python3 bench/expanded_attention.py --out $RES/expanded --write-providers $RES/expanded/providers.json" ;;
    # splash run's engine on the rollout-h200x2 workload at T = 1, 61 layers, prefill absorbed vs by form (one GPU)
    forms) section forms 560 python3 bench/prefill_forms.py --out "$RES/forms" ${FORMS_ARGS:-} ;;
    # the host planning step k+1 while the device runs step k (one GPU): the engine's tokens with and without
    # overlap on the GPU, then the rollout-h200x2 run of `forms` (prefill by form) with and without it
    overlap) section overlap 560 bash -c "python3 -m pytest -q -p no:cacheprovider -rs -m gpu tests/test_engine_overlap.py &&
              python3 bench/prefill_forms.py --forms auto --overlap on,off --out $RES/overlap" ;;
    # graph memory at real widths and, through forced switches, the re-captures a switch costs (one GPU)
    graphmem) section graphmem 400 python3 bench/graph_memory.py --out "$RES/graphmem" ;;
    # sampled tokens chosen on the device (one GPU): the GPU tests, the choice's speed on the device and row by
    # row on the host, then splash serve under sglang.bench_serving greedy and sampled, and sampled with the
    # server of the tree in .oldtree (git archive of the commit before, which sampled on the host) where present
    sampling) section sampling 580 bash -c "python3 -m pytest -q -p no:cacheprovider -rs tests/test_sampling_and_experts.py -k device;
                python3 -m pytest -q -p no:cacheprovider -rs -m gpu tests/test_engine_overlap.py;
                python3 bench/sampling_speed.py --out $RES/sampling;
                A='--layers 4 --num-prompts 64 --rates inf --input-len 2048 --range-ratio 0.5 --output-len 64 --budget-s 150 --workdir /tmp/rw --out $RES/sampling';
                python3 bench/serve_bench.py \$A --keep --num-prompts 16 --out /tmp/warm-up;  # writes the checkpoint, compiles the kernels
                python3 bench/serve_bench.py \$A --reuse --keep --name served_bench-ab-greedy;
                python3 bench/serve_bench.py \$A --reuse --keep --temperature 1.0 --name served_bench-ab-sampled;
                if [ -d .oldtree ]; then SPLASH_GIT_COMMIT=\${OLD_COMMIT:-old} PYTHONPATH=\$PWD/.oldtree \
                  python3 bench/serve_bench.py \$A --reuse --temperature 1.0 --name served_bench-ab-sampled-before; fi" ;;
    # DeepSeek Sparse Attention (one GPU): the conformance suite's DSA and MLA cases, then a V3.2-width decode step
    # and prefill chunk at 32K/128K, dense vs sparse, Triton vs FlashMLA, bf16 and fp8 caches, beside their roofline
    dsa) section dsa 560 bash -c "python3 -m pytest -q -p no:cacheprovider -rs --pyargs splash_core.testing \
           --splash-backend hopper --splash-ranks 1 -k 'dsa or mla';
         python3 bench/dsa_step.py --out $RES/dsa --budget-s ${DSA_BUDGET:-300} --write-providers $RES/dsa/providers.json" ;;
    # FP8 block-scaled GEMMs (one GPU): the Triton kernel beside bf16 and torch's row-wise FP8 at DeepSeek-V3 shapes
    fp8gemm) section fp8gemm 300 python3 bench/fp8_gemm.py --out "$RES/fp8gemm" ;;
    # where the step's time goes against its roofline (issue 39; one GPU, 420 s in all): the replayed decode step
    # profiled by kernel class at B = 16/64, 32K/128K (bf16), then the 61-layer rollout-h200x2 run's physical
    # limit with bf16 and with FP8 feed-forward weights; each under its own limit, so an overrun loses only itself.
    # 61 layers of bf16 weights (73 GB) do not fit an 80 GB H100: there both runs take 36 ($ROOFLINE_LAYERS sets it)
    roofline) L=${ROOFLINE_LAYERS:-$(python3 -c 'import torch
print(61 if torch.cuda.get_device_properties(0).total_memory > 100 * 2**30 else 36)' 2>/dev/null || echo 61)}
              P=$(python3 -c 'import sys; sys.path.insert(0, "bench")
from splash_bench.platform_name import accelerator_platform; print(accelerator_platform())')
              section roofline 440 bash -c "timeout 120 python3 bench/decode_step.py --out $RES/roofline --profile --platform $P \
                --batches 16,64 --contexts 32768,131072 --no-unfused --reps 5 --budget-s 75;
              timeout 150 python3 bench/prefill_forms.py --forms auto --layers $L --platform $P --out $RES/roofline;
              timeout 150 python3 bench/prefill_forms.py --forms auto --layers $L --platform $P --ffn-weights fp8 \
                --out $RES/roofline" ;;
    # FP8 experts served (one GPU): sglang.bench_serving against splash serve on 4 real-width layers with the
    # feed-forward weights in bf16 and kept FP8, each after a warm-up run of its own (kernel compilation)
    servefp8) section servefp8 560 bash -c "A='--layers 4 --num-prompts 64 --rates inf --input-len 2048 --range-ratio 0.5
                --output-len 64 --budget-s 100 --workdir /tmp/rw';
              for w in compute fp8; do
                timeout 130 python3 bench/serve_bench.py \$A --keep --reuse --ffn-weights \$w --num-prompts 16 --out /tmp/warm;
                timeout 110 python3 bench/serve_bench.py \$A --reuse --keep --ffn-weights \$w --name served_bench-ffn-\$w \
                  --out $RES/servefp8; done" ;;
    *) echo "unknown section $s (known: calibrate kernels runtime switch engine kda conformance hostprof trace transport peer interference serve graphs decode theta fp8 expanded forms overlap graphmem sampling dsa fp8gemm roofline servefp8)"; exit 2 ;;
  esac
done
