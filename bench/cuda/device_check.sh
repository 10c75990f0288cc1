#!/usr/bin/env bash
# One prepared pass on a lent GPU machine (the `device` tool of this workplace), from the
# repository root: the gpu tests, compute-sanitizer, the GPU attention benchmarks against
# PyTorch's SDPA, and hack-run on the synthetic 8B shape. That machine has CUDA, PyTorch
# and compute-sanitizer but none of our Debian libraries, so the binaries and their
# libraries come built from here in .devcarry/bundle.tar.xz (bench/cuda/pack_device.sh;
# git ignores it, so the call names it in `carry`). The tree that travels must stay under the
# tool's 64 MiB: with the tokenizer fixtures it is ~70 MB, so untrack what the gpu tests do not
# read for the call (git rm -r --cached -q tests/fixtures/shared tests/fixtures/tokenizers and
# exclude both in .git/info/exclude; git reset afterwards). Logs go to $OUT; a short summary
# ends the output.
#
#   bench/cuda/device_check.sh [steps...]
#   steps: tests memcheck racecheck attn sweep profile sdpa run runs decode hackmem attn2 sdpa2 decodefp prefill cluster
#          planattn planruns
#   (default: tests cluster planattn attn sdpa memcheck racecheck run)
set -u
OUT=${OUT:-/tmp/hack-device-out}
mkdir -p "$OUT"
steps=${*:-tests cluster planattn attn sdpa memcheck racecheck run}
here=$(pwd)
# The tests find fixtures through the source path compiled in (/work/main).
if [ "$here" != /work/main ] && [ ! -e /work/main ]; then mkdir -p /work && ln -s "$here" /work/main; fi
hb=/tmp/hb
mkdir -p $hb && tar -xJf .devcarry/bundle.tar.xz -C $hb || { echo "bundle missing"; exit 1; }
cuda_libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, q, "lib") for p in nvidia.__path__ for q in os.listdir(p)))' 2>/dev/null); do
  [ -e "$d/libcublasLt.so.13" ] && cuda_libs="$cuda_libs:$d"
done
export LD_LIBRARY_PATH="$hb/lib$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PATH:/usr/local/cuda/bin"
summary=()
step() {  # step NAME TIMEOUT CMD...: runs, logs to $OUT/NAME.log, records rc
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "=== $name: $(printf "%s " "$@" | cut -c1-160)"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  summary+=("$name rc=$rc $((SECONDS - t0))s")
}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  ldd $hb/bin/gpu_test | grep -i "not found"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} 2>&1
for s in $steps; do
  case $s in
    tests) step gpu_test 75 $hb/bin/gpu_test -r compact --durations yes ;;
    attn) step attention 90 $hb/bin/cuda_attention_bench ;;
    sweep) step sweep 90 bash -c "for v in '' '--min-pages-per-split 1' '--min-pages-per-split 4' '--warps-per-sm 64' \
             '--warps-per-sm 16'; do echo \"## \$v\"; $hb/bin/cuda_attention_bench --modes hack2 --contexts 4096,32768,131072 \
             --batch 1,8,32 \$v; done" ;;
    profile) step profile 150 bash -c "for c in 'hack2 4096 1' 'hack2 32768 32'; do set -- \$c; \
               echo \"#### \$c\"; ncu --clock-control none --kernel-name regex:'decode_(split|combine)_kernel|decode_attention' \
               --launch-skip 6 --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats \
               --section WarpStateStats --section SchedulerStats --section SourceCounters $hb/bin/cuda_attention_bench --modes \$1 \
               --contexts \$2 --batch \$3 --trials 1; done" ;;
    sass) step sass 30 bash -c "cuobjdump -sass -arch sm_90 $hb/bin/cuda_attention_bench | \
            awk '/Function :/ {keep = (\$0 ~ /decode_split_kernelILi2ELi2E|decode_combine/)} keep' > $OUT/sass.txt; wc -l $OUT/sass.txt" ;;
    sdpa) step sdpa 75 python3 bench/cuda/sdpa_bench.py ;;
    memcheck) step memcheck 75 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3 \
                $hb/bin/gpu_test -r compact "~[backend]" ;;
    # racecheck on the kernels' own tests: the whole-model [backend] tests run the same kernels
    # and take over 240 s under racecheck.
    racecheck) step racecheck 45 compute-sanitizer --tool racecheck --error-exitcode 3 \
                 $hb/bin/gpu_test -r compact "[hack]~[backend],[attention]~[backend],[page_selection]~[backend]" ;;
    runs) for kv in fp hack; do for n in 512 8192; do
            step hack_run_${kv}_$n 80 $hb/bin/hack-run --synthetic llama-8b --device cuda --kv $kv --max-tokens 256 \
              --ignore-eos --prompt-ids "$(seq -s, 100 $((n + 99)))" --log-level warn --max-model-len 16384
          done; done ;;
    attn2) step attention2 90 $hb/bin/cuda_attention_bench --modes bf16,hack2 --contexts 4096,32768,131072 --batch 1,8,32 ;;
    sdpa2) step sdpa2 75 python3 bench/cuda/sdpa_bench.py --contexts 4096,32768,131072 --batch 1,8,32 ;;
    decodefp) step decode_bench_fp 120 $hb/bin/cuda_decode_bench --kv fp --prefill none --batch 1,8,32 \
                --contexts 4096,8192,32768,131072 ;;
    prefill) step prefill_bench 120 $hb/bin/cuda_decode_bench --kv fp --batch 1 --contexts 4096 --steps 8 \
               --prefill 512,2048,8192 ;;
    decode) step decode_bench 240 $hb/bin/cuda_decode_bench --batch 1,8,32 --contexts 4096,8192,32768,131072 ;;
    hackmem) step hack_memcheck 90 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3 \
               $hb/bin/gpu_test -r compact "[hack-batch]" ;;
    # A 1P1D cluster on --device cuda (hack-tiny, fp and hack KV) equal to hack-run --device cuda
    # token for token (bench/cuda/cluster_check.sh; `cpu` runs the same check on any machine).
    cluster) step cluster 150 env UCX_MODULE_DIR=$hb/lib/ucx OUT=$OUT/cluster bash bench/cuda/cluster_check.sh cuda \
               $hb/bin models/hack-tiny ;;
    # The CUDA runner of the AttentionPlan in the whole model equals the kernels path token for
    # token (bench/cuda/plan_attention_check.sh), and its speed beside the kernels' on 8B.
    planattn) step plan_attention 120 bash bench/cuda/plan_attention_check.sh $hb/bin models/hack-tiny ;;
    planruns) for attn in kernels plan; do
                step hack_run_hack_8192_$attn 80 $hb/bin/hack-run --synthetic llama-8b --device cuda --kv hack \
                  --cuda-attention $attn --max-tokens 128 --ignore-eos --prompt-ids "$(seq -s, 100 8291)" --log-level warn \
                  --max-model-len 16384
              done ;;
    run) step hack_run 50 $hb/bin/hack-run --synthetic llama-8b --device cuda --kv fp --max-tokens 128 --ignore-eos \
           --prompt-ids "$(seq -s, 100 611)" --log-level warn ;;
    *) echo "unknown step $s" ;;
  esac
done
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.log"
