#!/usr/bin/env bash
# Several benchmarks/step_check_probe.py runs side by side on one GPU: does a PRM learn the
# mod-5 half of the step check (first-error AUROC on even offsets) with more steps, more
# data, fewer off-by-one training errors or a deeper backbone? Each run measures its PRM
# every 550 steps (probe.json's "curve"), so a run cut off at the time limit keeps its curve.
#
#   bash benchmarks/probe_sweep.sh OUT [SECONDS_PER_RUN] [DEVICE] [SET]
#
# SET "first" (the default) compares budgets and data mixes; "deep" checks the 8 x 96 recipe
# that came out of it (another seed, BetaPRM, batch 128, the world's own error mix);
# "budget" keeps the default recipe's budget (48,000 traces seen) and changes how it is spent:
# learning rate, schedule, batch size (13 runs, one thread each; with BB=DIR the seeds' runs
# reuse the backbones DIR/seedS of `betaprm demo` runs instead of pretraining); "freeze" runs
# the default recipe (its 1,500-step schedule, as on a CPU) with 0, 2 and 4 frozen layers on
# seeds 1 and 2 (6 runs).
# Writes OUT/NAME/probe.json and OUT/NAME.log per run, then OUT/summary.txt.
set -u
out=${1:?usage: bash benchmarks/probe_sweep.sh OUT [SECONDS_PER_RUN] [DEVICE] [first|deep]}
limit=${2:-480}
device=${3:-cuda}
set_=${4:-first}
mkdir -p "$out"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}src" PYTHONUNBUFFERED=1

threads=2 every=550
run() {
    local name=$1; shift
    timeout "$limit" python benchmarks/step_check_probe.py --out "$out/$name" --device "$device" --threads $threads --eval-every $every "$@" > "$out/$name.log" 2>&1 &
}

deep="--train-near-miss 0.3 --n-train-problems 12000 --num-layers 8 --hidden-size 96"
if [ "$set_" = budget ]; then
threads=1
for seed in 0 2; do
    bb=${BB:+--backbone $BB/seed$seed}
    every=500
    run base_s$seed              --seed $seed $bb
    run lr3e3_s$seed             --seed $seed $bb --prm-lr 3e-3
    run lr3e3_const_s$seed       --seed $seed $bb --prm-lr 3e-3 --prm-schedule constant_with_warmup
    every=1000
    run b16_s$seed               --seed $seed $bb --prm-batch 16 --prm-steps 3000
    run b16_lr2e3_s$seed         --seed $seed $bb --prm-batch 16 --prm-steps 3000 --prm-lr 2e-3
done
every=500 bb=${BB:+--backbone $BB/seed0}
run beta_s0        --seed 0 $bb --objective beta-binomial
run beta_lr3e3_s0  --seed 0 $bb --objective beta-binomial --prm-lr 3e-3
run lr6e3_s0       --seed 0 $bb --prm-lr 6e-3
elif [ "$set_" = freeze ]; then
threads=1 every=500
for seed in 1 2; do
    bb=${BB:+--backbone $BB/seed$seed}
    for n in 0 2 4; do
        run freeze${n}_s$seed --seed $seed $bb --prm-steps 1500 --prm-freeze-layers $n
    done
done
elif [ "$set_" = deep ]; then
run deep_seed1      $deep --prm-steps 6600 --seed 1
run deep_beta       $deep --prm-steps 6600 --objective beta-binomial
run deep_b128_s2200 $deep --prm-steps 2200 --prm-batch 128
run deep_nm_default --n-train-problems 12000 --num-layers 8 --hidden-size 96 --prm-steps 6600
else
run base                                     # the demo recipe: 1,100 steps, 6,000 traces
run nm03_s3300      --train-near-miss 0.3 --prm-steps 3300
run s6600_d12k      --prm-steps 6600 --n-train-problems 12000
run nm03_s6600_d12k --train-near-miss 0.3 --prm-steps 6600 --n-train-problems 12000
run nm03_b128_s2200_d12k --train-near-miss 0.3 --prm-batch 128 --prm-steps 2200 --n-train-problems 12000
run nm03_8x96_s6600_d12k --train-near-miss 0.3 --prm-steps 6600 --n-train-problems 12000 --num-layers 8 --hidden-size 96
run beta_nm03_s6600_d12k --objective beta-binomial --train-near-miss 0.3 --prm-steps 6600 --n-train-problems 12000
fi
wait

python - "$out" <<'EOF' | tee "$out/summary.txt"
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
for f in sorted(out.glob("*/probe.json")):
    r = json.loads(f.read_text())
    b = r["backbone_surprise_first_error_auroc"]
    print(f"== {f.parent.name} ({'finished' if r.get('finished') else 'cut off'}; backbone surprise odd/even {b.get('odd', float('nan')):.3f}/{b.get('even', float('nan')):.3f}; "
          f"parity observer {r['parity_check']['within_problem_auroc']:.3f}, Bayes {r['bayes']['within_problem_auroc']:.3f})")
    points = r["curve"] + ([{"step": r["config"]["prm_steps"], "seconds": r["seconds"], **r["prm"]}] if r.get("finished") else [])
    for p in points:
        print(f"  step {p['step']:>5} ({p['seconds']:>4.0f}s): within AUROC {p['within_problem_auroc']:.3f}  first-error odd {p.get('first_error_auroc_odd', float('nan')):.3f}"
              f"  even {p.get('first_error_auroc_even', float('nan')):.3f}  mu MAE {p['mu_mae_bayes']:.3f}")
EOF
