#!/usr/bin/env bash
# The GPU tests and benchmarks behind docs/PERFORMANCE.md, one section after another on
# one GPU (each benchmark runs alone on it). From the repo root on the GPU host (torch,
# triton, transformers, peft installed):
#   OUT=/tmp/gpu-run bash scripts/gpu_run.sh tests agent kernels coldload decode trace trace1 trace1000 online attention
# (`hf`: HF + PEFT alone on the trace's 256 requests, ~400 s: a device call of its own)
# (`ktests`, `kfused`: quicker subsets of `tests` and `kernels`; `etests`: the engine's GPU
# tests + the folded-SiLU kernel test; `silu`: the folded gate/up expand sweep; `overlap`:
# LoRA on a side stream under the GEMM; `trace128` / `trace128p`: the trace with 128
# adapters only, without / with the torch.profiler kernel tables; `kmixed`: sweep and
# bench of the 257-1024-row class on mixed-step cases; `split128` / `hostprof`: trace128
# with host-enqueue vs device time per step / plus cProfile; `pw128`: split128 with
# piecewise graphs for mixed steps; `launch`: host µs per launch; `anatomy`: the fused
# decode launch's time split into launch + prologue, shrink, exchange, expand; `stests`:
# the packed and row-split shrink tests on CUDA; `kprefill`: one fused launch with tall
# row tiles for prefill (T class 4,096, square); `trace128w`: trace128 at 256 seqs / 8,192
# tokens over 1,024 requests; `trace128r` / `trace128wr`: the two with both engines side by
# side, alternating A/B rounds (`--rounds`), median ratio; `mlpfold`: the MLP's LoRA in two
# launches instead of three; `ktp`: the decode fused entries against each other, on the
# TP=1 modules and their TP=2 shards; `dattn`: decode attention per split-KV config)
# and on a 2-GPU host the tensor-parallel sections `tp tptests` (`tplocal`: `tp` with the
# default layout only; `tpfold`: TP=2 with the LoRA folded into the base GEMMs and their
# consumer ops, against the launch path); on one GPU `poolfold` / `enginefold`: engine.step()
# decode with the factors in the agent's unified pool / the engine's tables, launched vs
# folded.
# (tests/ is a package, so tests/agent is `tests.agent` and never shadows the `agent`
# package, with or without an editable install.)
# Results: $OUT/<section>.txt (logs), $OUT/<section>/ (JSON); $OUT/sections.txt has the
# exit status of each section (124 = cut by its time limit).
set -u
OUT=${OUT:-/tmp/gpu-run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET

section() {  # name, time limit (s), command...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? tuned=${ADAPTERPLANE_LORA_TUNED:-}" >> "$OUT/sections.txt"
  # CHAIN_TUNED=1: a tuning section's tuned file is appended to ADAPTERPLANE_LORA_TUNED
  # (read in order at import, later files win), so it serves every later section, e.g.
  # `CHAIN_TUNED=1 ... gpu_run.sh kdepth kmixed trace128 decode`
  if [ -n "${CHAIN_TUNED:-}" ] && [ -f "$OUT/$name/tuned_configs.json" ]; then
    export ADAPTERPLANE_LORA_TUNED="${ADAPTERPLANE_LORA_TUNED:+$ADAPTERPLANE_LORA_TUNED:}$OUT/$name/tuned_configs.json"
  fi
}

for s in "$@"; do
  case $s in
    tests) section tests 240 env OMP_NUM_THREADS=1 python3 -m pytest -n 14 -q -p no:cacheprovider -m gpu --import-mode=append \
             tests/kernels tests/ops tests/attention/test_gpu.py tests/engine/test_gpu.py \
             tests/engine/test_pool_slots_gpu.py tests/pool/test_cuda_copy.py \
             tests/collections/test_native_serving_gpu.py ;;
    collserve) section collserve 420 python3 bench/collection_serving.py --members 16 64 128 \
             --out "$OUT/collserve" ;;
    collserve4) section collserve4 420 python3 bench/collection_serving.py --members 64 \
             --clusters 4 --out "$OUT/collserve4" ;;
    ktests) section ktests 240 env OMP_NUM_THREADS=1 python3 -m pytest -n 14 -q -p no:cacheprovider -m gpu --durations=15 \
              --import-mode=append tests/kernels tests/ops ;;  # the kernel subset of `tests`
    kernels) section kernels 300 python3 bench/lora_kernels.py --tune --no-loop --no-stacked \
               --out "$OUT/kernels" ;;
    kfused) section kfused 320 python3 bench/lora_kernels.py --tune --tune-sweeps fused \
              --no-loop --no-stacked --only "T=64 n=1,T=64 n=16,T=64 n=64,n=50" \
              --out "$OUT/kfused" ;;  # the fused-grid sweep + the decode rows only
    kdepth) section kdepth 300 python3 bench/lora_kernels.py --tune --tune-sweeps fuseddepth \
              --no-loop --no-stacked --only "T=64 n=16,T=64 n=64,n=50" \
              --out "$OUT/kdepth" ;;  # fused entries x stages / warps / PDL
    ktp) section ktp 300 python3 bench/lora_kernels.py --tune --tune-sweeps fusedtp \
           --no-loop --no-stacked --only "T=64 n=16,T=64 n=64,n=50" \
           --out "$OUT/ktp" ;;  # decode fused entries vs each other, TP=1 modules and TP=2 shards
    kmixed) section kmixed 420 python3 bench/lora_kernels.py --tune --tune-sweeps mixed \
              --no-loop --no-stacked --only mixed --out "$OUT/kmixed" ;;  # T classes 1024 and 4096 on mixed steps
    kprefill) section kprefill 300 python3 bench/lora_kernels.py --tune --tune-sweeps prefillfused \
                --no-loop --no-stacked --only prefill --out "$OUT/kprefill" ;;  # T class 4096 fused, tall tiles
    coldload) section coldload 90 python3 bench/coldload.py --device cuda --shape 8b \
                --loads 20 --adapters 64 --pool-adapters 16 --requests 400 \
                --out "$OUT/coldload" ;;
    decode) section decode 200 python3 bench/engine.py --mode decode-step --max-num-seqs 64 \
              --prompt-max 512 --adapters 16 128 --kv-blocks 4096 --steps 20 \
              --scheduling sync async --out "$OUT/decode" ;;
    trace) section trace 420 python3 bench/engine.py --mode cuda --adapters 16 128 \
             --requests 256 --rate inf --prompt-min 64 --prompt-max 512 --output-min 64 \
             --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 \
             --kv-blocks 8192 --hf-batch 64 --hf-requests 64 --out "$OUT/trace" ;;
    trace128) section trace128 300 python3 bench/engine.py --mode cuda --adapters 128 \
                --requests 256 --rate inf --prompt-min 64 --prompt-max 512 --output-min 64 \
                --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 \
                --kv-blocks 8192 --skip-hf --out "$OUT/trace128" ;;  # `trace`, 128 adapters only
    trace128pool) section trace128pool 420 python3 bench/engine.py --mode cuda --adapters 128 \
                   --pool --fold --requests 256 --rate inf --prompt-min 64 --prompt-max 512 \
                   --output-min 64 --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 \
                   --kv-blocks 16384 --skip-hf --out "$OUT/trace128pool" ;;  # trace128 as a pool agent serves it: unified pool + fold
    trace128w) section trace128w 420 python3 bench/engine.py --mode cuda --adapters 128 \
                 --requests 1024 --rate inf --prompt-min 64 --prompt-max 512 --output-min 64 \
                 --output-max 128 --max-num-seqs 256 --max-batched-tokens 8192 \
                 --kv-blocks 16384 --skip-hf --out "$OUT/trace128w" ;;  # 256 seqs / 8,192 tokens, steady state
    trace128r) section trace128r 420 python3 bench/engine.py --mode cuda --adapters 128 \
                 --requests 256 --rate inf --prompt-min 64 --prompt-max 512 --output-min 64 \
                 --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 \
                 --kv-blocks 8192 --skip-hf --rounds 5 --out "$OUT/trace128r" ;;  # A/B rounds
    trace128wr) section trace128wr 540 python3 bench/engine.py --mode cuda --adapters 128 \
                  --requests 1024 --rate inf --prompt-min 64 --prompt-max 512 --output-min 64 \
                  --output-max 128 --max-num-seqs 256 --max-batched-tokens 8192 \
                  --kv-blocks 16384 --skip-hf --rounds 3 --out "$OUT/trace128wr" ;;  # A/B rounds
    trace128e) section trace128e 300 python3 bench/engine.py --mode cuda --adapters 128 \
                 --requests 256 --rate inf --prompt-min 64 --prompt-max 512 --output-min 64 \
                 --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 \
                 --kv-blocks 8192 --skip-hf --no-piecewise --out "$OUT/trace128e" ;;  # eager mixed steps
    trace128p) section trace128p 400 python3 bench/engine.py --mode cuda --adapters 128 \
                 --requests 256 --rate inf --prompt-min 64 --prompt-max 512 --output-min 64 \
                 --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 \
                 --kv-blocks 8192 --skip-hf --profile --out "$OUT/trace128p" ;;
    split128) section split128 400 python3 bench/engine.py --mode cuda --adapters 128 \
                --requests 256 --rate inf --prompt-min 64 --prompt-max 512 --output-min 64 \
                --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 \
                --kv-blocks 8192 --skip-hf --split-eager --no-piecewise \
                --out "$OUT/split128" ;;  # host enqueue vs device time per step, eager mixed steps
    hostprof) section hostprof 400 python3 bench/engine.py --mode cuda --adapters 128 \
                --requests 256 --rate inf --prompt-min 64 --prompt-max 512 --output-min 64 \
                --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 \
                --kv-blocks 8192 --skip-hf --split-eager --host-profile --no-piecewise \
                --out "$OUT/hostprof" ;;  # split128 + cProfile of the eager steps, gc passes
    pw128) section pw128 400 python3 bench/engine.py --mode cuda --adapters 128 \
             --requests 256 --rate inf --prompt-min 64 --prompt-max 512 --output-min 64 \
             --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 \
             --kv-blocks 8192 --skip-hf --piecewise --split-eager \
             --out "$OUT/pw128" ;;  # split128 with piecewise graphs for mixed steps (the default)
    launch) section launch 120 python3 bench/launch_overhead.py --out "$OUT/launch" ;;  # host µs per launch
    trace1|trace1000) section "$s" 420 python3 bench/engine.py --mode cuda --adapters "${s#trace}" \
              --requests 256 --rate inf --prompt-min 64 --prompt-max 512 --output-min 64 \
              --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 \
              --kv-blocks 8192 --skip-hf --out "$OUT/$s" ;;  # N = 1 or 1,000 adapters (+ no LoRA)
    hf) section hf 560 python3 bench/engine.py --mode cuda --only-hf --adapters 128 \
          --requests 256 --rate inf --prompt-min 64 --prompt-max 512 --output-min 64 \
          --output-max 128 --hf-batch 64 --out "$OUT/hf" ;;  # HF + PEFT on the whole trace
    online) section online 200 python3 bench/engine.py --mode cuda --adapters 16 128 \
              --requests 256 --rate 24 --prompt-min 64 --prompt-max 512 --output-min 64 \
              --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 \
              --kv-blocks 8192 --skip-hf --out "$OUT/online" ;;
    agent) section agent 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
             tests/agent/test_agent_async.py ;;
    attention) section attention 40 python3 bench/attention.py ;;
    dattn) section dattn 120 python3 bench/decode_attention.py --out "$OUT/dattn" ;;  # paged decode attention per split-KV config
    silu) section silu 200 python3 bench/lora_silu.py --sweep --out "$OUT/silu" ;;  # the folded gate/up expand, tuned
    etests) section etests 200 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" \
              --import-mode=append tests/engine/test_gpu.py tests/kernels/test_expand_silu.py \
              tests/kernels/test_fast_launch_gpu.py tests/kernels/test_step_memo.py \
              tests/engine/test_piecewise_gpu.py ;;
    anatomy) section anatomy 120 python3 bench/lora_anatomy.py --out "$OUT/anatomy" ;;  # fused decode launch: where its µs go
    stests) section stests 240 env OMP_NUM_THREADS=1 python3 -m pytest -n 8 -q -p no:cacheprovider --import-mode=append \
              tests/kernels/test_shrink_pack.py tests/kernels/test_row_split.py ;;  # unmarked tests that run on CUDA when present
    concat) section concat 240 python3 bench/lora_concat_probe.py --out "$OUT/concat" ;;  # prefill LoRA in the GEMM?
    mlpfold) section mlpfold 240 python3 bench/lora_mlp_fold_probe.py --out "$OUT/mlpfold" ;;  # gate/up + SiLU + down shrink in one launch?
    overlap) section overlap 300 python3 bench/lora_overlap.py --out "$OUT/overlap" ;;  # LoRA under the GEMM?
    tp) section tp 350 python3 bench/tp.py --shape 8b --device cuda --tp 1 2 \
          --adapters 0 16 128 --attention triton --graphs graphs --out "$OUT/tp" ;;  # 2 GPUs
    tplocal) section tplocal 350 python3 bench/tp.py --shape 8b --device cuda --tp 1 2 \
          --adapters 0 16 128 --layouts no_extra_collectives --attention triton \
          --graphs graphs --profile 10 --out "$OUT/tplocal" ;;  # `tp` without the paper layout, kernel time per kind (2 GPUs)
    tpfold) section tpfold 400 python3 bench/tp.py --shape 8b --device cuda --tp 2 \
          --adapters 0 16 128 --layouts no_extra_collectives --attention triton \
          --graphs graphs --fold --profile 5 --out "$OUT/tpfold" ;;  # TP=2 decode, LoRA launched vs folded into the GEMMs (2 GPUs)
    tpzipf) section tpzipf 300 python3 bench/tp.py --shape 8b --device cuda --tp 2 \
          --adapters 0 128 --layouts no_extra_collectives --attention triton \
          --graphs graphs --fold --zipf 1.0 --out "$OUT/tpzipf" ;;  # tpfold at 128 adapters, Zipf(1) popularity (2 GPUs)
    tpctx) section tpctx 400 python3 bench/tp.py --shape 8b --device cuda --tp 2 \
          --adapters 0 16 128 --layouts no_extra_collectives --attention triton \
          --graphs graphs --fold --context 2048 --kv-blocks 9000 --out "$OUT/tpctx" ;;  # tpfold at context 2048 (2 GPUs)
    tp4) section tp4 500 python3 bench/tp.py --shape 8b --device cuda --tp 2 4 \
          --adapters 0 16 128 --layouts no_extra_collectives --attention triton \
          --graphs graphs --fold --out "$OUT/tp4" ;;  # TP=2 vs TP=4, launched vs folded (4 GPUs)
    tptests) section tptests 540 python3 -m pytest -q -s -p no:cacheprovider --noconftest \
               tests/parallel/test_tp_graphs_gpu.py tests/parallel/test_tp_piecewise_gpu.py \
               tests/agent/test_tp_ranks_gpu.py ;;  # 2 GPUs
    tpengine) section tpengine 400 python3 bench/tp_engine.py --tp 1 2 --adapters 0 16 \
          --out "$OUT/tpengine" ;;  # engine.step() decode at TP=1/2, sync vs async (2 GPUs)
    poolfold) section poolfold 560 bash -c 'for f in "" --fold; do python3 bench/tp_engine.py \
          --tp 1 --pool --adapters 0 16 128 --scheduling async --kv-blocks 8192 $f \
          --out "$OUT/poolfold$f"; done' ;;  # one GPU, the agent's unified pool: launched vs folded
    enginefold) section enginefold 560 bash -c 'for f in "" --fold; do python3 bench/tp_engine.py \
          --tp 1 --adapters 0 16 128 --scheduling async --kv-blocks 8192 $f \
          --out "$OUT/enginefold$f"; done' ;;  # the same with engine-held factor tables
    tpmixed) section tpmixed 560 python3 bench/tp.py --shape 8b --device cuda --tp 1 2 \
          --adapters 0 16 128 --layouts no_extra_collectives --attention triton \
          --graphs graphs --piecewise --out "$OUT/tpmixed" ;;  # + mixed steps, eager vs piecewise (2 GPUs)
    *) echo "unknown section $s" >&2; exit 2 ;;
  esac
done
cat "$OUT/sections.txt"
