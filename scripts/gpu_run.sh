#!/usr/bin/env bash
# The GPU test set and the product's benchmarks, one section after another (each
# benchmark runs alone on its GPU). From the repo root on the GPU host (torch, triton,
# transformers, peft installed):
#   OUT=/tmp/gpu-run bash scripts/gpu_run.sh tests kernels trace decode coldload collserve poolfold
#   OUT=/tmp/gpu-run bash scripts/gpu_run.sh tp tptests      # on a 2-GPU host
# Sections:
#   tests      the GPU-marked pytest set: kernels, ops, attention, engine, pool, collections
#   kernels    LoRA kernels per module and step shape vs their bytes' floor, after the
#              --tune sweeps (bench/lora_kernels.py)
#   trace      random-weights Llama-3-8B trace, 256 requests, LoRA vs no-LoRA engine in
#              alternating A/B rounds, median throughput ratio; 128 then 16 adapters
#              (bench/trace.py)
#   traceauto  the trace's 128 adapters at 128 seqs / 4,096 tokens with the agent's default
#              fold (the cost model), LoRA rounds then no-LoRA rounds on one model
#              (--sequential: fits an 80 GB card)
#   many       the trace with 1,000 adapters, 1,024 requests, LoRA vs no-LoRA in A/B rounds,
#              for each popularity:policy:fold in MANY_RUNS (default: Zipf(1.0) at the agent's
#              defaults, fair and the fold cost model; Zipf under fcfs, fold off: the same
#              plans in both arms; uniform at the defaults; bench/trace.py --popularity)
#   decode     one decode step (64 requests at context 512) vs its HBM floor, 0/16/128
#              adapters, sync and async loops (bench/decode_step.py)
#   coldload   cold adapter load through the pool vs its H2D floor; a Zipf working set of
#              64 adapters over a pool of 16 (hit rate, loads)
#   collserve  decode step with collection members served natively vs as LoRAs (16/64/128)
#   poolfold   engine.step() decode (bench/tp_engine.py --tp 1, factors pinned in the
#              engine's unified pool), LoRA launched vs folded into the base GEMMs
#              (0/16/128 adapters)
#   fairness   the fair policy's throughput vs fcfs on a 128-adapter, 4-tenant trace, and
#              goodput under an overload ramp to 2x capacity, fcfs / fair / newest_first
#              (bench/fairness.py)
#   noisy      noisy neighbour: tenant A at 10x tenant B's 8 req/s, B's TTFT under the fair
#              policy vs B alone, at step token budgets 4096 and 1024 (bench/fairness.py)
#   alora      N in {1, 4, 16} activated LoRAs on a cached 1k / 4k-token conversation vs the
#              same factors as ordinary LoRAs and vs base requests (bench/alora.py)
#   sampling   decode step at B = 64 with top-5 logprobs / penalties / logit bias (and
#              grammar) on 0, 50 and 100% of the rows vs an argmax-only sampler
#              (bench/sampling.py; LLAMA3_TOKENIZER=<tokenizer.json> for the grammar rows)
#   zipf       adapter residency: Zipf(1.2) over 1,000 adapters and 128 slots through the
#              agent's engine loop (bench/zipf_residency.py)
#   zipf10k    10,000 registered rank-4 q adapters, Zipf(1.0), 128 slots, a 256 MiB host tier
#              (bounded below the working set): throughput, cold loads per second, load
#              amplification, images packed again (bench/zipf_residency.py --host-mib)
#   http       the agent over HTTP vs its own engine.step() on one workload: 8B shape, 128
#              rank-16 q/k/v/o adapters, 1,024 requests of 256 / 128 tokens at 256 streams,
#              then Poisson at 80% of the engine's peak; the arms run one after the other in
#              their own processes (an 80 GB card holds one at a time); py-spy samples the
#              agent's GIL holder if it is on PATH (bench/http_vs_engine.py;
#              HTTP_TOKENIZER_DIR=<dir with tokenizer.json>, else SmolLM2's is prepared)
#   tp         TP=2 vs TP=1 decode, prefill and mixed steps through the engine, 0/16/128
#              adapters, decode replayed from CUDA graphs; collectives per step (the LoRA
#              adds none); the TP ranks load a random 8B model directory written once under
#              /tmp/adapterplane-bench-tp (bench/tp.py; 2 GPUs)
#   tptests    the tensor-parallel GPU tests: TP graphs, piecewise graphs, agent ranks (2 GPUs)
# CHAIN_TUNED=1: the tuned file a section writes ($OUT/<section>/tuned_configs.json, from
# `kernels`) is appended to ADAPTERPLANE_LORA_TUNED for the later sections, e.g.
#   CHAIN_TUNED=1 OUT=/tmp/gpu-run bash scripts/gpu_run.sh kernels trace
# Results: $OUT/<section>.txt (logs), $OUT/<section>/ (JSON); $OUT/sections.txt has the
# exit status of each section (124 = cut by its time limit) and the tuned files in force.
set -u
OUT=${OUT:-/tmp/gpu-run}
export OUT
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET

section() {  # name, time limit (s), command...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? tuned=${ADAPTERPLANE_LORA_TUNED:-}" >> "$OUT/sections.txt"
  if [ -n "${CHAIN_TUNED:-}" ] && [ -f "$OUT/$name/tuned_configs.json" ]; then
    export ADAPTERPLANE_LORA_TUNED="${ADAPTERPLANE_LORA_TUNED:+$ADAPTERPLANE_LORA_TUNED:}$OUT/$name/tuned_configs.json"
  fi
}

for s in "$@"; do
  case $s in
    tests) section tests 240 env OMP_NUM_THREADS=1 python3 -m pytest -n 14 -q -p no:cacheprovider -m gpu --import-mode=append \
             tests/kernels tests/ops tests/attention/test_gpu.py tests/engine/test_gpu.py \
             tests/engine/test_pool_slots_gpu.py tests/pool/test_cuda_copy.py \
             tests/collections/test_native_serving_gpu.py tests/engine/test_alora.py \
             tests/engine/test_sampling_controls.py tests/engine/test_prompt_logprobs.py \
             tests/sampling/test_grammar_gpu.py ;;
    kernels) section kernels 300 python3 bench/lora_kernels.py --tune --no-loop --no-stacked \
               --out "$OUT/kernels" ;;
    trace) section trace 640 bash -c 'for n in 128 16; do python3 bench/trace.py --mode cuda \
             --adapters $n --requests 256 --rate inf --prompt-min 64 --prompt-max 512 \
             --output-min 64 --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 \
             --kv-blocks 8192 --skip-hf --rounds 5 --out "$OUT/trace/n$n"; done' ;;
    traceauto) section traceauto 560 python3 bench/trace.py --mode cuda --adapters 128 \
             --requests 256 --rate inf --prompt-min 64 --prompt-max 512 --output-min 64 \
             --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 --kv-blocks 8192 \
             --skip-hf --rounds 3 --fold auto --sequential --out "$OUT/traceauto" ;;
    many) section many 600 bash -c 'for run in ${MANY_RUNS:-zipf:fair:auto zipf:fcfs:off uniform:fair:auto}; do
             IFS=: read -r pop policy fold <<< "$run"
             python3 bench/trace.py --mode cuda --adapters 1000 --popularity $pop \
             --policy $policy --fold ${fold:-off} --requests 1024 --rate inf --prompt-min 64 \
             --prompt-max 512 --output-min 64 --output-max 128 --max-num-seqs 128 \
             --max-batched-tokens 4096 --kv-blocks 8192 --skip-hf --rounds 3 \
             --out "$OUT/many/${run//:/-}"; done' ;;
    decode) section decode 420 python3 bench/decode_step.py --max-num-seqs 64 --prompt-max 512 \
              --adapters 16 128 --kv-blocks 4096 --steps 20 --scheduling sync async \
              --out "$OUT/decode" ;;
    coldload) section coldload 90 python3 bench/coldload.py --device cuda --shape 8b \
                --loads 20 --adapters 64 --pool-adapters 16 --requests 400 \
                --out "$OUT/coldload" ;;
    collserve) section collserve 420 python3 bench/collection_serving.py --members 16 64 128 \
                 --out "$OUT/collserve" ;;
    poolfold) section poolfold 560 bash -c 'for f in off on; do python3 bench/tp_engine.py \
                --tp 1 --adapters 0 16 128 --scheduling async --kv-blocks 8192 --fold $f \
                --out "$OUT/poolfold-$f"; done' ;;
    fairness) section fairness 560 bash -c 'set -e; for s in policy-throughput overload-ramp; do
                python3 bench/fairness.py --scenario $s --shape llama3-8b --device cuda \
                --dtype bfloat16 --trace-adapters 128 --tenants 4 --requests 384 --rounds 3 \
                --ramp-s 15 --max-queue-s 2 --capacity-requests 384 --prompt-min 64 \
                --prompt-max 512 --output-min 64 --output-max 128 --max-num-seqs 128 \
                --max-batched-tokens 4096 --kv-blocks 8192 --out "$OUT/fairness"; done' ;;
    noisy) section noisy 400 bash -c 'set -e; for b in 4096 1024; do
             python3 bench/fairness.py --shape llama3-8b --device cuda --dtype bfloat16 \
             --adapters 8 --rate-b 8 --ratio 10 --duration-s 15 --policies fair \
             --prompt-min 64 --prompt-max 512 --output-min 64 --output-max 128 \
             --max-num-seqs 128 --max-batched-tokens $b --kv-blocks 8192 \
             --out "$OUT/noisy-b$b"; done' ;;
    alora) section alora 300 python3 bench/alora.py --shape llama3-8b --device cuda \
             --dtype bfloat16 --contexts 1024 4096 --n 1 4 16 --max-batched-tokens 8192 \
             --kv-blocks 8192 --out "$OUT/alora" ;;
    sampling) section sampling 300 python3 bench/sampling.py --shape llama3-8b --device cuda \
             --dtype bfloat16 --batch 64 --ctx 512 --kv-blocks 4096 \
             ${LLAMA3_TOKENIZER:+--tokenizer "$LLAMA3_TOKENIZER"} --out "$OUT/sampling" ;;
    zipf) section zipf 300 python3 bench/zipf_residency.py --shape llama3-8b --device cuda \
            --dtype bfloat16 --adapters 1000 --slots 128 --rank 8 --targets q_proj v_proj \
            --rate 16 --duration-s 60 --prompt-min 64 --prompt-max 512 --output-min 64 \
            --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 --kv-blocks 8192 \
            --prefetch 32 --out "$OUT/zipf" ;;
    zipf10k) section zipf10k 560 python3 bench/zipf_residency.py --shape llama3-8b \
               --device cuda --dtype bfloat16 --adapters 10000 --slots 128 --rank 4 \
               --targets q_proj --host-mib 256 --zipf 1.0 --rate 16 --duration-s 60 \
               --prompt-min 64 --prompt-max 512 --output-min 64 --output-max 128 \
               --max-num-seqs 128 --max-batched-tokens 4096 --kv-blocks 8192 --prefetch 32 \
               --out "$OUT/zipf10k" ;;
    http) section http 560 bash -c 'set -e; common="--shape llama3-8b --dtype bfloat16 \
            --device cuda --adapters 128 --rank 16 --concurrency 256 --num-requests 1024 \
            --poisson-requests 512 --input-len 256 --output-len 128 --workdir /tmp/hve-work \
            ${HTTP_TOKENIZER_DIR:+--tokenizer-dir $HTTP_TOKENIZER_DIR}"
            python3 -m bench.http_vs_engine $common --arms engine --out-dir "$OUT/http/engine"
            rate=$(python3 -c "import json, sys; print(next(r[\"rate\"] for r in json.load(open(sys.argv[1]))[\"runs\"] if r[\"run\"] == \"poisson\"))" "$OUT/http/engine/summary.json")
            python3 -m bench.http_vs_engine $common --arms http --poisson-rate $rate \
              --profile-agent 6 --out-dir "$OUT/http/http"' ;;
    tp) section tp 900 python3 bench/tp.py --shape 8b --device cuda --tp 1 2 \
          --adapters 0 16 128 --attention triton --graphs graphs --out "$OUT/tp" ;;
    tptests) section tptests 540 python3 -m pytest -q -s -p no:cacheprovider --noconftest \
               tests/parallel/test_tp_graphs_gpu.py tests/parallel/test_tp_piecewise_gpu.py \
               tests/agent/test_tp_ranks_gpu.py ;;
    *) echo "unknown section $s" >&2; exit 2 ;;
  esac
done
cat "$OUT/sections.txt"
