#!/usr/bin/env bash
# The GPU session's measurements (issue 35), as run on a lent GPU machine through the
# device tool: one prepared script, each step under its own time limit, every log and
# results file packed into $OUT after each step (a step cut off keeps the others').
#
#   bash benchmarks/gpu/run.sh a     # CUDA tests, training MFU, decoding, long attention
#   bash benchmarks/gpu/run.sh b     # the quickstart on the GPU, ListOps per kernel
#   bash benchmarks/gpu/run.sh c     # issue 31: ListOps, the Bible's genres and the
#                                    # character LM per kernel, one task after another
#
# The machine's own python3 (PyTorch with CUDA) runs aiayn from src/ (it is not
# installed there); the prepared data sets travel in .gpu/ (git-ignored): the Bible
# corpus in .gpu/qs/data, ListOps in .gpu/listops, the genre passages in
# .gpu/bible-genre and the character corpus in .gpu/bible-chars.
set -u
part=${1:?usage: run.sh a|b|c}
OUT=${OUT:-/tmp/gpu-out}
W=/tmp/gpu-work
mkdir -p "$OUT" "$W"
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}

pack() { tar czf "$OUT/gpu-$part.tgz" -C "$W" . 2>/dev/null; }
step() {  # step NAME SECONDS COMMAND...: run it, log it, record its exit status and time
    local name=$1 limit=$2 began=$SECONDS
    shift 2
    echo "== $name (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@" >"$W/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc ${SECONDS}s-${began}s=$((SECONDS - began))s" | tee -a "$W/steps.txt"
    tail -n 25 "$W/$name.log"
    cp benchmarks/results/*gpu*.json "$W/" 2>/dev/null
    pack
}

if [ "$part" = a ]; then
    step env 30 bash -c "nvidia-smi; $PY -c 'import torch, transformers; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), transformers.__version__)'; nproc; free -g"
    step cuda-tests 100 $PY -m pytest tests/cuda -q -n 8 -p no:cacheprovider --junitxml="$W/cuda-tests.xml"
    step train 170 $PY -m benchmarks.bench_train --device cuda --sizes base,big \
        --systems aiayn-bf16,aiayn-compiled-bf16,hf-bf16,torch-nn-bf16 \
        --batch 800 --src-len 32 --tgt-len 32 --warmup 2 --rounds 6 --results train-gpu
    step decode-b32 90 $PY -m benchmarks.bench_decode --device cuda --threads 4 --sizes base \
        --beams 1,4 --batch 32 --no-latency --rounds 3 \
        --systems aiayn,aiayn-bf16,hf,hf-bf16,aiayn-static,aiayn-cudagraph --results decode-gpu-b32
    step decode-b256 60 $PY -m benchmarks.bench_decode --device cuda --threads 4 --sizes base \
        --beams 1,4 --batch 256 --no-latency --rounds 3 \
        --systems aiayn,aiayn-bf16,hf,hf-bf16 --results decode-gpu-b256
    step attention 60 $PY -m benchmarks.bench_attention --device cuda --results attention-gpu \
        --lengths 1024,4096,16384,65536 --max-gib 24 --repeats 3
    step backends 25 $PY -m benchmarks.bench_attention --only backends --results attention-gpu \
        --backend-lengths 4096,16384,65536 --max-gib 24 --repeats 3
fi

if [ "$part" = b ]; then
    # the second call: part a's cut-off steps again, one size each and no compiled row
    # (compiling base and big took part a's whole 170 s), HF on the GPU fixed
    step train-big 95 $PY -m benchmarks.bench_train --device cuda --sizes big \
        --systems aiayn-bf16,hf-bf16,torch-nn-bf16 \
        --batch 800 --src-len 32 --tgt-len 32 --warmup 2 --rounds 5 --results train-gpu-big
    step decode-b32 60 $PY -m benchmarks.bench_decode --device cuda --threads 4 --sizes base \
        --beams 1,4 --batch 32 --no-latency --rounds 3 \
        --systems aiayn,aiayn-bf16,hf,hf-bf16,aiayn-cudagraph --results decode-gpu-b32
    # the quickstart and the ListOps runs share the card (said with their figures):
    # every ListOps run gets the same 2.5 training minutes, side by side
    step listops-quickstart 200 bash -c "\
        $PY -m benchmarks.bench_efficient --device cuda --data .gpu/listops --steps 100000 \
            --parallel 15 --workdir /tmp/listops-runs --set train.max_minutes=2.5 \
            --set train.valid_every_steps=100 > $W/listops.log 2>&1 & \
        $PY -m aiayn quickstart --device cuda --out .gpu/qs --minutes 2.5 > $W/quickstart.log 2>&1; \
        wait"
    tail -n 12 "$W/listops.log"
    for d in /tmp/listops-runs/*/; do
        n=$(basename "$d"); mkdir -p "$W/listops-runs/$n"
        cp "$d"/result.json "$d"/metrics.jsonl "$d"/train.log "$W/listops-runs/$n/" 2>/dev/null
    done
    cp /tmp/listops-runs/*.log "$W/listops-runs/" 2>/dev/null
    cp .gpu/qs/results.json "$W/quickstart-results.json" 2>/dev/null
    cp .gpu/qs/run/metrics.jsonl "$W/quickstart-metrics.jsonl" 2>/dev/null
    cp .gpu/qs/run/train.log "$W/quickstart-train.log" 2>/dev/null
    cp benchmarks/results/*gpu*.json benchmarks/results/efficient-listops.json "$W/" 2>/dev/null
    pack
    step decode-b256 40 $PY -m benchmarks.bench_decode --device cuda --threads 4 --sizes base \
        --beams 1,4 --batch 256 --no-latency --rounds 3 \
        --systems aiayn-bf16,hf-bf16 --results decode-gpu-b256
fi
echo "done: $(cat "$W/steps.txt" | tr '\n' ';')"

if [ "$part" = c ]; then
    # every run of a task gets the same training minutes; the tasks take turns, each
    # with all its runs side by side on the card (said with their figures)
    for task in listops:listops bible-genre:bible-genre charlm:bible-chars; do
        name=${task%%:*}
        step "efficient-$name" 170 $PY -m benchmarks.bench_efficient --task "$name" \
            --device cuda --data ".gpu/${task#*:}" --steps 100000 --parallel 15 \
            --workdir "/tmp/runs-$name" --set train.max_minutes=1.75 \
            --set train.valid_every_steps=100
        for d in /tmp/runs-$name/*/; do
            n=$(basename "$d"); mkdir -p "$W/runs-$name/$n"
            cp "$d"/result.json "$d"/metrics.jsonl "$d"/train.log "$W/runs-$name/$n/" 2>/dev/null
        done
        cp /tmp/runs-$name/*.log "$W/runs-$name/" 2>/dev/null
        cp benchmarks/results/efficient-*.json "$W/" 2>/dev/null
        pack
    done
fi
