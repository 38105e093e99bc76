"""compare.py's table: columns from the swept fields, seed statistics, length buckets, test sets."""

import csv
import math
import statistics

import pytest
import scipy.stats
from sacrebleu.metrics import BLEU

from seq2seq import compare, sweep
from seq2seq.errors import UserError
from tests.conftest import fast_tiny_config

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_columns_are_the_fields_that_differ():
  a = {"model": {"num_heads": 2, "attention": "dot"}, "train": {"seed": 0, "steps": 4}}
  b = {"model": {"num_heads": 4, "attention": "dot"}, "train": {"seed": 0, "steps": 4}}
  c = {"model": {"num_heads": 4, "attention": "dot"}, "train": {"seed": 1, "steps": 4}}
  assert compare.differing_fields([a, b, c]) == ["model.num_heads", "train.seed"]
  assert compare.differing_fields([a, a]) == []


def test_seeds_group_runs_that_differ_only_in_the_seed():
  rows = [{"run": n, "model.num_heads": h, "train.seed": s}
          for n, h, s in [("a", 2, 0), ("b", 2, 1), ("c", 4, 0), ("d", 4, 1)]]
  groups = compare.seed_groups(rows, ["model.num_heads", "train.seed"])
  assert {k: [r["run"] for r in g] for k, g in groups.items()} == {(2,): ["a", "b"],
                                                                    (4,): ["c", "d"]}


def test_seed_statistics_and_welch_test_by_hand():
  rows = [{"run": f"r{i}", "model.num_heads": h, "train.seed": s, "val_bleu": bleu}
          for i, (h, s, bleu) in enumerate([(2, 0, 28.0), (2, 1, 28.5), (2, 2, 29.5),
                                             (4, 0, 30.0), (4, 1, 31.0), (4, 2, 32.0)])]
  seeds = compare.seed_aggregate(rows, ["model.num_heads", "train.seed"], ["val"], "r0")
  base, other = seeds
  assert base["model.num_heads"] == 2 and base["seeds"] == 3 and base["val_welch_p"] is None
  assert base["val_bleu_mean"] == pytest.approx(86.0 / 3)
  assert base["val_bleu_sd"] == pytest.approx(math.sqrt(((28 - 86 / 3) ** 2 + (28.5 - 86 / 3) ** 2
                                                         + (29.5 - 86 / 3) ** 2) / 2))
  assert other["val_bleu_mean"] == 31.0 and other["val_bleu_sd"] == pytest.approx(1.0)
  # Welch: t = (m1 - m2) / sqrt(v1/n1 + v2/n2), Welch-Satterthwaite degrees of freedom.
  v1, v2 = 1.0, statistics.variance([28.0, 28.5, 29.5])
  se2 = v1 / 3 + v2 / 3
  t = (31.0 - 86.0 / 3) / math.sqrt(se2)
  df = se2**2 / ((v1 / 3) ** 2 / 2 + (v2 / 3) ** 2 / 2)
  assert other["val_welch_p"] == pytest.approx(2 * scipy.stats.t.sf(t, df), rel=1e-9)
  assert 0.01 < other["val_welch_p"] < 0.1
  assert compare.welch_p_value([30.0], [28.0, 29.0]) is None  # One seed: no test.


def test_length_buckets_score_each_bucket_alone():
  sources = ["a " * 3, "b " * 12, "c " * 15, "d " * 40]
  refs = ["der Hund läuft", "die Katze schläft hier", "ein Mann fährt Rad", "zwei Frauen"]
  hyps = ["der Hund läuft", "die Katze schläft", "ein Mann fährt Rad", "drei Männer"]
  buckets = compare.length_buckets(sources, hyps, refs)
  assert [(b["bucket"], b["sentences"]) for b in buckets] == [("0-9", 1), ("10-19", 2),
                                                               ("20-29", 0), ("30+", 1)]
  assert buckets[1]["bleu"] == pytest.approx(
      BLEU().corpus_score(hyps[1:3], [refs[1:3]]).score)
  assert buckets[2]["bleu"] is None
  assert buckets[3]["bleu"] == pytest.approx(0.0)


@pytest.mark.parametrize("spec,message", [
    ("test2017", "--test_set=test2017 is not NAME=SRC,REF; e.g."
     " --test_set=test2017=data/test_2017.en,data/test_2017.de."),
    ("val=a.en,a.de", "--test_set=val=a.en,a.de: 'val' is a split of the runs' corpus; give the"
     " files another name."),
    ("t=missing.en,missing.de", "--test_set=t=missing.en,missing.de: missing.en is not a file;"
     " pass an existing text file."),
])
def test_a_bad_test_set_is_one_line(spec, message):
  with pytest.raises(UserError) as e:
    compare.parse_test_set(spec)
  assert str(e.value) == message


@pytest.mark.slow
def test_a_two_field_sweep_is_compared_with_seeds_and_a_test_set(tmp_path):
  c = fast_tiny_config()
  c.train.num_steps, c.eval.every_steps = 4, 2
  root = tmp_path / "sweep"
  status = sweep.run_sweep(c, ["model.num_heads=2,4", "train.seed=0,1"], root)
  assert set(status.values()) == {"trained"}
  src, ref = tmp_path / "extra.en", tmp_path / "extra.de"
  src.write_text("A dog runs.\nTwo men play football in a long green park.\n", encoding="utf-8")
  ref.write_text("Ein Hund rennt.\nZwei Männer spielen Fußball in einem langen Park.\n",
                 encoding="utf-8")
  runs = sorted(root.iterdir())
  out = tmp_path / "report"
  rows = compare.compare_runs(runs, out, baseline=root / "num_heads-2_seed-0", split="val",
                              test_sets=[compare.parse_test_set(f"extra={src},{ref}")],
                              beam_size=1, n_samples=50)
  with open(out / "comparison.csv", encoding="utf-8") as f:
    table = list(csv.DictReader(f))
  assert list(table[0]) == ["run", "model.num_heads", "train.seed", "parameters", "steps",
                            "train_minutes", "tokens_per_sec", "val_bleu", "val_chrf",
                            "val_bleu_ci95", "val_p_value", "extra_bleu", "extra_chrf",
                            "extra_bleu_ci95", "extra_p_value"]
  assert table[0]["run"] == "num_heads-2_seed-0" and rows[0]["extra_p_value"] is None
  with open(out / "seeds.csv", encoding="utf-8") as f:
    seeds = list(csv.DictReader(f))
  assert [(s["model.num_heads"], s["seeds"]) for s in seeds] == [("2", "2"), ("4", "2")]
  four = [r["extra_bleu"] for r in rows if r["model.num_heads"] == 4]
  assert float(seeds[1]["extra_bleu_mean"]) == pytest.approx(statistics.mean(four))
  assert "Welch's t-test" in (out / "comparison.md").read_text()
  with open(out / "length.csv", encoding="utf-8") as f:
    assert len(list(csv.DictReader(f))) == 4 * len(compare.LENGTH_EDGES + (None,))
  assert (out / "length.png").read_bytes()[:8] == PNG
