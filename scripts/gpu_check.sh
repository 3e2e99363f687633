#!/usr/bin/env bash
# The megatron backend's GPU checks in one command, for a GPU machine without network access:
#   tests/gpu (nccl, bf16, TE spec when importable, GRPO steps incl. the distributed optimizer and
#   generation.backend=megatron), the generation contract suite with the real TensorRT-LLM where it
#   imports (generation=trtllm), and benchmarks/megatron_tokens_per_s.py (~0.5B model, bf16).
# Needs python3 with CUDA torch + transformers, and .gpu_wheels/ from scripts/gpu_wheels.sh for the
# rest. Results and logs go to $OUT (default: ./gpu_out). Keeps going when a step fails; exit 1 then.
# With .gpu_model/ (a model's config + tokenizer files, e.g. SmolLM2's from the model cache; its weights
# are too large to carry) it first runs benchmarks/throughput.py on that architecture with random
# weights (benchmarks/random_weights.py). Each step's time limit: GPU_*_TIMEOUT (seconds).
# GPU_CHECK_PARTS picks the steps (comma-separated; default all): decode (rollout tokens/s, dynamic vs
# static cache + CUDA graphs, benchmarks/decode.py), megatron_decode (the megatron generation backend:
# megatron-core's loop vs its static path, benchmarks/megatron_decode.py), kernels (log-prob kernels vs torch and Liger,
# benchmarks/kernels_gpu.py, their device time and the stats kernel's variants; carry liger-kernel's
# wheel in .gpu_wheels), update (the update on a
# long-tailed batch), e2e (sync vs async end to end; GPU_E2E_CASES overrides its case list,
# GPU_E2E_NAME its results name, GPU_E2E_EXTRA adds overrides), shared_prefix, tests (GPU_TESTS
# overrides the test list), trtllm, megatron. GPU_DECODE_ARGS / GPU_BENCH_ARGS add arguments to
# benchmarks/decode.py (e.g. --cases static_graphs static_graphs_grouped --profile) /
# megatron_tokens_per_s.py (e.g. --profile, or --logprob-micro-batch-size 32 as in
# results/megatron_tokens_per_s_h200_round2.md). All of them take longer than one device call (10 min):
# split them over calls; calls in a row on one machine install the wheels and write the random-weight
# model once.
#   device tool: run(command="GPU_CHECK_PACK=1 bash scripts/gpu_check.sh", carry=[".gpu_wheels", ".gpu_model"])
#   the async target alone: run(command="GPU_CHECK_PARTS=e2e GPU_CHECK_PACK=1 bash scripts/gpu_check.sh", ...)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
status=0
PARTS=",${GPU_CHECK_PARTS:-decode,megatron_decode,kernels,update,e2e,shared_prefix,tests,trtllm,megatron},"
part() { [[ "$PARTS" == *",$1,"* ]]; }
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
  for mod in transformers megatron.core transformer_engine triton tensorrt_llm; do
    python3 -c "import $mod; print('$mod', getattr($mod, '__version__', 'present'))" 2>/dev/null || echo "$mod missing"
  done
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# The image's python3 is itself a venv holding torch + transformers: the carried wheels go into a folder
# on PYTHONPATH beside it (a venv over it would not see its packages), and the repo runs from source.
site=/tmp/nemo_azr_site
if [ -d .gpu_wheels ] && [ ! -f "$site/.installed" ]; then  # once per machine: calls in a row reuse it
  python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$site" .gpu_wheels/*.whl \
    >> "$OUT/install.log" 2>&1 && touch "$site/.installed" || { echo "wheel install failed (see install.log)"; status=1; }
fi
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"


# Throughput levers on the GPU (docs/throughput.md): the update on a long-tailed batch, and end to end
# sync vs async rollout (the producer on its own CUDA stream, or the decode loop in its own process),
# padded and packed; the shared-prefix forward.
if [ -d .gpu_model ]; then
  model=/tmp/nemo_azr_gpu_model
  [ -f "$model/config.json" ] || python3 benchmarks/random_weights.py .gpu_model "$model" > "$OUT/throughput.log" 2>&1 || status=1
  # Rollout decode at 512 responses x 128 tokens: results/decode_gpu.md
  part decode && { timeout "${GPU_DECODE_TIMEOUT:-240}" python3 benchmarks/decode.py --model "$model" \
    --device cuda --prompts 64 --n 8 --new-tokens 128 ${GPU_DECODE_ARGS:-} > "$OUT/decode.log" 2>&1 || status=1; \
    cp benchmarks/results/decode_gpu.* "$OUT/" 2>/dev/null; tail -n 40 "$OUT/decode.log"; }
  # The megatron generation backend: megatron-core's loop vs its static path: results/megatron_decode_gpu.md
  part megatron_decode && { timeout "${GPU_DECODE_TIMEOUT:-240}" python3 benchmarks/megatron_decode.py \
    --model "$model" --prompts 64 --n 8 --new-tokens 128 --out "$OUT" > "$OUT/megatron_decode.log" 2>&1 || status=1; \
    tail -n 12 "$OUT/megatron_decode.log"; }
  part update && { timeout "${GPU_THROUGHPUT_TIMEOUT:-300}" python3 benchmarks/throughput.py --parts update \
    --device cuda --model "$model" --rows 64 --max-response 1024 --budget 16384 --reps 3 \
    --update-overrides model.autocast_dtype=bfloat16 model.kernel_backend=torch --results-name throughput_gpu \
    >> "$OUT/throughput.log" 2>&1 || status=1; }
  # End to end at 512 responses per step (with 64, generation is 92% of the step and async can only
  # hide the small update): results/throughput_gpu_large.md
  e2e_cases=${GPU_E2E_CASES:-padded_sync padded_async packed_sync packed_async padded_async_process packed_async_process}
  # shellcheck disable=SC2086  # the case list and GPU_E2E_EXTRA's overrides are meant to split into words
  part e2e && { timeout "${GPU_E2E_TIMEOUT:-480}" python3 benchmarks/throughput.py --parts e2e --e2e-steps 5 \
    --e2e-budget 8192 --results-name "${GPU_E2E_NAME:-throughput_gpu_large}" --e2e-cases $e2e_cases \
    --e2e-overrides "model.path=$model" trainer.device=cuda generation.max_new_tokens=128 \
    model.kernel_backend=torch data.prompts_per_step=64 generation.n_samples=8 ${GPU_E2E_EXTRA:-} \
    --output-root /tmp/nemo_azr_throughput >> "$OUT/throughput.log" 2>&1 || status=1; }
  # Shared-prefix forward (RLCR confidence rows' layout): results/shared_prefix_gpu.md
  part shared_prefix && { timeout "${GPU_THROUGHPUT_TIMEOUT:-300}" python3 benchmarks/shared_prefix.py \
    --device cuda --model "$model" --contexts 16 --results-name shared_prefix_gpu \
    >> "$OUT/throughput.log" 2>&1 || status=1; }
  cp benchmarks/results/throughput_gpu*.* benchmarks/results/shared_prefix_gpu.* "$OUT/" 2>/dev/null
  tail -n 25 "$OUT/throughput.log"
fi

# The log-prob kernels against torch and Liger, with a tile x warps sweep: results/kernels_gpu.md
if part kernels; then
  timeout "${GPU_KERNELS_TIMEOUT:-300}" python3 benchmarks/kernels_gpu.py > "$OUT/kernels.log" 2>&1 || status=1
  cp benchmarks/results/kernels_gpu.* "$OUT/" 2>/dev/null
  # the pass's kernel time by the profiler, and the stats kernel's variants side by side
  # (results/stats_kernel_variants.md)
  timeout 120 python3 benchmarks/kernel_device_time.py >> "$OUT/kernels.log" 2>&1 || status=1
  OUT="$OUT" timeout 180 python3 benchmarks/stats_kernel_variants.py >> "$OUT/kernels.log" 2>&1 || status=1
  tail -n 40 "$OUT/kernels.log"
fi

# tests/gpu and the Triton kernel tests, which run compiled on a GPU (interpreted on CPU)
if part tests; then
  gpu_tests=${GPU_TESTS:-tests/gpu tests/unit/test_kernels_triton.py tests/unit/test_kernels_fused_loss.py \
    tests/unit/test_policy_fused_loss.py tests/unit/test_off_policy_in_update.py}
  # shellcheck disable=SC2086  # the test list is meant to split into words
  timeout "${GPU_TEST_TIMEOUT:-240}" python3 -m pytest -q $gpu_tests \
    -p no:cacheprovider --junitxml="$OUT/gpu_junit.xml" > "$OUT/gpu_tests.log" 2>&1 || status=1
  tail -n 15 "$OUT/gpu_tests.log"
fi

# generation=trtllm: the backend contract suite against the real TensorRT-LLM (docs/generation.md).
if ! part trtllm; then
  :
elif python3 -c "import tensorrt_llm" >> "$OUT/trtllm_tests.log" 2>&1; then
  NEMO_AZR_TRTLLM=real timeout 600 python3 -m pytest -q tests/unit/test_generation_contract.py -k trtllm \
    -p no:cacheprovider --junitxml="$OUT/trtllm_junit.xml" >> "$OUT/trtllm_tests.log" 2>&1 || status=1
  tail -n 15 "$OUT/trtllm_tests.log"
  # three GRPO steps with the engine: metrics.jsonl must carry the refit time and the probe gap
  timeout 600 python3 -m nemo_azr train generation=trtllm trainer.device=cuda trainer.max_steps=3 sft_warmup.steps=0 \
    logger=quiet trainer.output_dir="$OUT/trtllm_train" >> "$OUT/trtllm_train.log" 2>&1 \
    && grep -q generation/probe_logprob_gap "$OUT/trtllm_train/metrics.jsonl" || status=1
  tail -n 5 "$OUT/trtllm_train.log"
else
  echo "tensorrt_llm not importable: trtllm contract suite not run (see trtllm_tests.log)"
fi

# shellcheck disable=SC2086  # GPU_BENCH_ARGS (e.g. --profile) split into words
if part megatron; then
  timeout "${GPU_BENCH_TIMEOUT:-300}" python3 benchmarks/megatron_tokens_per_s.py --out "$OUT" ${GPU_BENCH_ARGS:-} > "$OUT/benchmark.log" 2>&1 || status=1
  tail -n 15 "$OUT/benchmark.log"
fi
# GPU_CHECK_PACK=1: everything in $OUT as one archive (the device tool returns at most 8 files)
if [ "${GPU_CHECK_PACK:-0}" = 1 ]; then
  tar czf /tmp/gpu_check_out.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/gpu_check_out.tgz "$OUT/"
fi
exit $status
