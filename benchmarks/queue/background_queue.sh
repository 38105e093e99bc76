#!/usr/bin/env bash
# The background queue of training runs that the open issues wait on, in the order the issues
# ask for (docs/experiments.md, "The attention of today", lists the same), two at a time: on the
# 2-core CPU two runs at once train 1.0-1.2x the tokens a second of one run on both cores, more
# where a step leaves a core idle (docs/performance.md, "One program, one by one, or in parallel").
# Each line trains one run; a finished run is skipped and an unfinished one resumes from its last
# checkpoint, so after a stop the same command continues where the queue stopped:
#
#   nohup setsid benchmarks/queue/background_queue.sh > runs/queue.log 2>&1 &
#
# (each run's output in runs/queue_logs/). A study whose runs must share one commit (issue 77's)
# runs the queue from a checkout of its own, outside the work tree, so that later commits do not
# change what its remaining lines train:
#
#   git worktree add --detach ~/seq2seq-queue COMMIT && cd ~/seq2seq-queue && nohup setsid \
#     benchmarks/queue/background_queue.sh > runs/queue.log 2>&1 &
#
# (both checkouts' runs/ are the same folder, so the work tree reads the results).
#
# A SIGTERM to its process group pauses it, each run saving a checkpoint first; the group's id
# is in runs/queue.pgid (so: kill -TERM -- -$(cat runs/queue.pgid); -STOP and -CONT hold it
# while a measurement needs a quiet machine).
set -u
cd "$(dirname "$0")/../.."  # The checkout's root.
# runs/ lives outside the work tree, in $SEQ2SEQ_RUNS (default ~/seq2seq-runs): a session's work
# tree is laid anew while its machine is kept, and runs/ went with the work tree three times.
if [ ! -e runs ]; then
  mkdir -p "${SEQ2SEQ_RUNS:=$HOME/seq2seq-runs}" && ln -s "$SEQ2SEQ_RUNS" runs
fi
# (--list only prints the lines that would run.)
[ "${1:-}" = --list ] || [ -d .venv ] || {
  python3 -m venv .venv && .venv/bin/pip install -q -e ".[dev,tfds]"; }
[ -d .venv ] && . .venv/bin/activate
# The unpacked recipe of the attention comparisons, with the default recipe's positions and
# attention dropout of then named, so that a later default does not change what these train.
OLD_DEFAULT="--config.model.positions=sinusoidal --config.model.attention_dropout_rate=0.0"
TF="seq2seq-sweep --config=configs/multi30k_transformer.py --config.data.pack=False $OLD_DEFAULT"
TF="$TF --root=runs/tf_new"
TF2025="seq2seq-sweep --config=configs/multi30k_transformer.py --config.data.pack=False"
TF2025="$TF2025 $OLD_DEFAULT --root=runs/tf_2025"
# The RNN variants' first two seeds trained at the RNN recipe's former two length buckets (5,504
# tokens a batch); their third seeds see the same batches.
RNN="seq2seq-sweep --config=configs/multi30k_rnn.py --config.data.num_buckets=2"
RNN="$RNN --config.data.tokens_per_batch=5504 --root=runs/rnn_new"
LOCAL="$RNN --config.model.attention_window=10 --sweep=model.attention"

# The evaluation of WORKDIR as the README's commands do it (with ENSEMBLE, its other members'
# workdirs, comma-separated: the members, each at its own selected checkpoint, as one model):
# validation first, choosing among CHOICES, then test once at the same beam; skipped once its
# test score is on disk. The published recipe chooses between `best` and `avg:10` at beam 5,
# the default recipe among `best`, `avg:3` and `avg:5` at beam 4.
choose_and_score() {
  local workdir=$1 ensemble=${2:-} beam_size=${3:-5} choices=${4:-best,avg:10} done beam
  beam="--beam_size=$beam_size --alpha=0.6"
  if [ -z "$ensemble" ]; then
    done="$workdir/eval/test.selected.beam$beam_size.json"
    echo "[ -f $done ] || { seq2seq-evaluate --workdir=$workdir --split=val" \
      "--checkpoint=$choices $beam && seq2seq-evaluate --workdir=$workdir --split=test" \
      "--checkpoint=selected $beam; }"
  else
    done="$workdir/eval/test.selected.ensemble*.beam$beam_size.json"
    echo "compgen -G '$done' > /dev/null || { for split in val test; do seq2seq-evaluate" \
      "--workdir=$workdir --ensemble=$ensemble --split=\$split --checkpoint=selected $beam ||" \
      "exit 1; done; }"
  fi
}

# The choice of a run's checkpoint AND search on validation (each of CHOICES at beam 4, 5 and 6
# and alpha 0.6 and 1.0: seq2seq-evaluate's grid), then test once with the chosen pair;
# skipped once its test score is on disk.
choose_search_and_score() {
  local workdir=$1 choices=$2
  echo "compgen -G '$workdir/eval/test.selected.beam*.json' > /dev/null || {" \
    "seq2seq-evaluate --workdir=$workdir --split=val --checkpoint=$choices" \
    "--beam_size=4,5,6 --alpha=0.6,1.0 && seq2seq-evaluate --workdir=$workdir --split=test" \
    "--checkpoint=selected; }"
}

# Issue 77's study of the default recipe (configs/multi30k_transformer.py, 4,000 packed steps):
# POSITIONS, ATTENTION_DROPOUT, SAMPLING and SEED, each swept explicitly so that every workdir's
# name says all three ingredients and a later change of the config's defaults does not change
# what a line trains; trained, then chosen on validation and scored on test as the README does.
study() {
  local name="positions-$1_attention_dropout_rate-$2_subword_sampling-$3_seed-$4"
  echo "seq2seq-sweep --config=configs/multi30k_transformer.py --root=runs/recipe_study" \
    "--sweep=model.positions=$1 --sweep=model.attention_dropout_rate=$2" \
    "--sweep=data.subword_sampling=$3 --sweep=train.seed=$4 &&" \
    "{ $(choose_and_score runs/recipe_study/$name '' 4 best,avg:3,avg:5); }"
}

runs() {
  local seed
  # Issue 77, item 1: the candidate (rotary positions, dropout 0.1 on the attention weights)
  # and the default as it is, three seeds each (the default's seed 0 is also in docs/recipe.md),
  # then the candidate with subword sampling (which decides the recipe), the default's seed 0 at
  # the study's commit (seq2seq-compare needs its workdir), then each ingredient alone at two
  # seeds (which says what each contributes). Each
  # trains alone: a run's result (and its wall time alone, which the README gives) comes in
  # 40-55 minutes rather than two in 70-80, so fewer are lost when the machine changes.
  {
    study rope 0.1 0.0 0
    for seed in 1 2; do study rope 0.1 0.0 $seed; study sinusoidal 0.0 0.0 $seed; done
    for seed in 0 1 2; do study rope 0.1 0.1 $seed; done
    study sinusoidal 0.0 0.0 0
    for seed in 0 1; do study rope 0.0 0.0 $seed; study sinusoidal 0.1 0.0 $seed; done
    for seed in 0 1; do study sinusoidal 0.0 0.1 $seed; done
  } | sed "s/^/ALONE /"
  # Issue 77, item 2: the published recipe with what the study found
  # (configs/multi30k_transformer_wu2021_plus.py), three seeds, each alone (2.5 hours or so on
  # the AVX-512 hosts: one run to a machine's day), chosen on validation among checkpoints and
  # searches, scored on test once and released to models/, since runs/ does not outlive a
  # machine; each line is skipped once its model is released.
  local plus model
  for seed in 0 1 2; do
    plus=runs/wu2021_plus/seed-$seed model=models/wu2021_plus/seed-$seed
    echo "ALONE [ -f $model/released.json ] || seq2seq-sweep" \
      "--config=configs/multi30k_transformer_wu2021_plus.py --root=runs/wu2021_plus" \
      "--sweep=train.seed=$seed"
    echo "ALONE [ -f $model/released.json ] || { $(choose_search_and_score $plus \
      best,avg:5,avg:10) && seq2seq-export --format=seq2seq --workdir=$plus" \
      "--checkpoint=selected --output=$model; }"
  done
  # Issue 78: the attention of 2025 at the unpacked recipe of "The attention of today"
  # (docs/experiments.md), two seeds each: QK-norm, the head-wise gate, differential attention,
  # sigmoid attention, a decoder without positions, and ALiBi that knows left from right.
  for seed in 0 1; do
    for variant in "model.qk_norm=True" "model.attention_gate=headwise" \
        "model.attention=differential" "model.attention_normalizer=sigmoid" \
        "model.decoder_positions=none" "model.positions=alibi_directional"; do
      echo "$TF2025 --sweep=$variant --sweep=train.seed=$seed"
    done
  done
  # Issue 56: the published recipe's three seeds on the CPU, each alone on both cores (2 to 3
  # hours on the AVX-512 hosts), each chosen on validation and scored on test once as soon as it
  # has trained (docs/recipe.md, "The same three seeds on the CPU"), then released to models/
  # (seq2seq-export --format=seq2seq: its chosen parameters, 10 MB, committed), since runs/ has
  # been lost with a session's work tree three times and the three never lived at once; then
  # the three released models as one. Seed 2 first: seeds 0 and 1 have been scored once already.
  for seed in 2 0 1; do
    local model=models/wu2021_cpu/seed-$seed
    echo "ALONE [ -f $model/released.json ] || seq2seq-sweep" \
      "--config=configs/multi30k_transformer_wu2021.py --root=runs/wu2021_cpu" \
      "--sweep=train.seed=$seed"
    echo "ALONE [ -f $model/released.json ] || { $(choose_and_score runs/wu2021_cpu/seed-$seed)" \
      "&& seq2seq-export --format=seq2seq --workdir=runs/wu2021_cpu/seed-$seed" \
      "--checkpoint=selected --output=$model; }"
  done
  echo "ALONE $(choose_and_score models/wu2021_cpu/seed-0 models/wu2021_cpu/seed-1,models/wu2021_cpu/seed-2)"
  # Issue 57's full-budget runs against JoeyNMT (its two recipes; ours on its schedule and with
  # its attention dropout) are done and recorded in docs/performance.md, "Against JoeyNMT"; the
  # commands are there. The queue trains them no more, since runs/ does not outlive a machine.
  # Issue 57: the RNN recipe at four length buckets (docs/rnn_buckets/ has seeds 0 and 1), three
  # seeds for the README's three-seed ensemble.
  for seed in 0 1 2; do
    echo "seq2seq-sweep --config=configs/multi30k_rnn.py --config.data.num_buckets=4" \
      "--config.data.tokens_per_batch=4176 --root=runs/rnn_buckets --sweep=train.seed=$seed"
  done
  # Issue 54: the third seed of every new variant (the first two of each are in docs/).
  for variant in "$TF --sweep=model.positions=relative" "$TF --sweep=model.num_kv_heads=1" \
      "$LOCAL=local_p" "$TF --sweep=model.attention_normalizer=entmax15" \
      "$TF --sweep=model.positions=rope" "$TF --sweep=model.positions=alibi" "$LOCAL=local_m" \
      "$RNN --sweep=model.attention_normalizer=entmax15" "$TF --sweep=model.positions=learned" \
      "$TF --sweep=model.num_kv_heads=2" "$TF --sweep=model.attention_normalizer=sparsemax"; do
    echo "$variant --sweep=train.seed=2"
  done
}

# QUEUE_ONLY and QUEUE_SKIP (extended regular expressions) keep or leave out the lines that
# match, so that one checkout trains a study pinned to its commit and another the rest:
#
#   (cd ~/seq2seq-queue && QUEUE_ONLY=recipe_study benchmarks/queue/background_queue.sh) &&
#     QUEUE_SKIP=recipe_study benchmarks/queue/background_queue.sh
chosen() {
  runs | grep -E -- "${QUEUE_ONLY:-.}" | { if [ -n "${QUEUE_SKIP:-}" ]; then
    grep -v -E -- "$QUEUE_SKIP"; else cat; fi; }
}
if [ "${1:-}" = --list ]; then chosen; exit 0; fi
# Each run's output goes to runs/queue_logs/, named by its root and swept values.
mkdir -p runs/queue_logs
ps -o pgid= $$ | tr -d ' ' > runs/queue.pgid
# (the first 160 characters of the name: a line that trains and then evaluates names its workdir
# three times, past the file system's 255, and its values differ within the first 160).
TRAIN='name=$(grep -o -- "--\(root\|workdir\|sweep\)=[^ ]*" <<< "$1" | sed "s/^--[a-z]*=//" \
  | paste -sd_ | tr -c "A-Za-z0-9._\n-" _ | cut -c1-160); eval "$1" > "runs/queue_logs/$name.log" 2>&1'
# Lines train two at a time; a line that starts with ALONE waits for the runs before it and
# trains by itself.
batch=()
two_at_a_time() {
  [ ${#batch[@]} -gt 0 ] && printf '%s\n' "${batch[@]}" | xargs -P 2 -d '\n' -I{} bash -c "$TRAIN" _ {}
  batch=()
}
while IFS= read -r line; do
  if [[ $line == "ALONE "* ]]; then two_at_a_time; bash -c "$TRAIN" _ "${line#ALONE }"
  else batch+=("$line"); fi
done < <(chosen)
two_at_a_time
