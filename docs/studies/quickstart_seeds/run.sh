#!/bin/bash
# The README's first-hour commands (quickstart, sample, fid) over seeds: the range a new user lands in.
cd "$(git rev-parse --show-toplevel)"
. .venv/bin/activate
export OMP_NUM_THREADS=1
mkdir -p runs/qs
for seed in 0 1 2; do
  for cfg in digits_mutor2d digits_ntp; do
    run=runs/qs/${cfg}_s$seed
    python train.py --config $cfg.yaml --out $run --set train.seed=$seed > $run.train.log 2>&1
    python sample.py --ckpt $run --num 1000 --npz $run/samples_cfg2.npz --cfg 2.0 > $run.sample.log 2>&1
    python eval/fid.py $run/samples_cfg2.npz --ref digits:train > $run.fid.log 2>&1
    echo "$run done $(date)"
  done
done
echo QSDONE
