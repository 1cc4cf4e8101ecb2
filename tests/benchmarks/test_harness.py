"""The benchmark harness: one quick pass on digits runs, measures, renders, and resumes without rerunning."""

import json
from pathlib import Path

import pytest

from helpers import benchmark_harness

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_pass_measures_renders_and_resumes(tmp_path: Path):
    harness = benchmark_harness()
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nwritten by hand\n")
    argv = ["--quick", "--datasets", "digits", "--only", "dpsd-label-eps1-*", "--out", str(tmp_path / "bench"),
            "--markdown", str(markdown)]  # the teacher it reads comes with it
    assert harness.main(argv) == 0
    rows = {row["run"]: row for row in json.loads((tmp_path / "bench" / "results.json").read_text())}
    assert set(rows) == {"teacher-digits", "dpsd-label-eps1-digits"}
    assert rows["teacher-digits"]["accuracy_mean"] > 50  # 12 steps in the quick pass: 81% (seed 0), 70% (1 and 2)
    label = rows["dpsd-label-eps1-digits"]
    assert 0.99 < label["epsilon"] <= 1.0 and label["peak_rss_mb"] > 50 and label["wall_seconds"] > 0
    # the fractions are the run's own measured phases, the evaluation left out
    phases = json.loads((tmp_path / "bench" / "dpsd-label-eps1-digits" / "seed0" / "report.json").read_text()
                        )["timing"]["phases"]
    fractions = label["phase_fractions"]
    assert "evaluate" in phases and set(fractions) == set(phases) - {"evaluate"} and "annotate" in fractions
    assert fractions["annotate"] / fractions["student"] == pytest.approx(phases["annotate"] / phases["student"])
    text = markdown.read_text()  # the headline: rows chosen by name, the hand-written text kept around it
    assert text.startswith("# Benchmarks\n\nwritten by hand") and "### Routes, digits" in text
    assert "| `teacher-digits` |" in text and "| `dpsd-label-eps1-digits` |" in text
    assert "| DPSD at a sound epsilon |" not in text  # the group column lives in the full table only
    assert "(bench/results.md#commands)" in text and "(bench/privacy_accuracy.png)" in text
    full = (tmp_path / "bench" / "results.md").read_text()  # every row, its phases and its command
    assert "| DPSD at a sound epsilon | `dpsd-label-eps1-digits` |" in full and "\n## Commands\n" in full
    assert "- `dpsd-label-eps1-digits`: `dpdistill transcribe " in full
    assert (tmp_path / "bench" / "privacy_accuracy.png").exists()

    report = tmp_path / "bench" / "dpsd-label-eps1-digits" / "seed0" / "report.json"
    before = report.stat().st_mtime_ns
    assert harness.main(argv) == 0  # finished runs are reused, the table is rebuilt
    assert report.stat().st_mtime_ns == before
    assert markdown.read_text().count(harness.BEGIN) == 1


def test_a_partial_pass_replaces_its_rows_and_keeps_the_others_under_their_current_group():
    harness = benchmark_harness()
    groups = {run.name: run.group for run in harness.table(("fmnist", "mnist"), 1)}
    previous = [{"run": "teacher-mnist", "group": "renamed since", "v": 0}, {"run": "upper-bound-fmnist", "v": 1},
                {"run": "retired-row"}]
    measured = [{"run": "upper-bound-fmnist", "group": "upper bound (no privacy)", "v": 2},
                {"run": "teacher-fmnist", "group": "teacher"}]
    assert harness.merge(previous, measured, groups) == [*measured[::-1], {"run": "teacher-mnist", "group": "teacher",
                                                                            "v": 0}]


def test_a_selection_brings_the_teachers_it_reads_and_no_others():
    harness = benchmark_harness()
    runs = harness.table(("fmnist",), 1)

    def names(pattern: str) -> list[str]:
        return [run.name for run in harness.select(runs, [pattern])]

    assert names("ensemble-50-label-eps1-*") == ["teachers-50-fmnist", "ensemble-50-label-eps1-fmnist"]
    assert names("dpsgd-eps1-*") == ["dpsgd-eps1-fmnist"]  # trains on the data: no teacher
    assert names("srr-paper-eps1-*") == ["teacher-fmnist", "srr-paper-eps1-fmnist"]
    assert names("pate-50-eps1-*") == ["teachers-50-fmnist", "pate-50-eps1-q200-fmnist"]
    assert names("pate-*-cnn-*") == ["teachers-250-fmnist", "teachers-100-shift-fmnist",
                                     "pate-250-cnn-eps1-q200-fmnist", "pate-100-shift-cnn-eps10-q2000-fmnist"]
    assert names("pate-*-fixmatch-*") == ["teachers-250-fmnist", "teachers-100-shift-fmnist",
                                          "pate-250-fixmatch-eps1-q200-fmnist",
                                          "pate-100-shift-fixmatch-eps10-q2000-fmnist", "pretrain-fmnist",
                                          "teachers-250-pretrained-fmnist",
                                          "pate-250-pretrained-fixmatch-eps1-q200-fmnist",
                                          "pate-250-pretrained-fixmatch-eps10-q2000-fmnist",
                                          "pate-250-pretrained-fixmatch-posterior-eps10-q2000-fmnist",
                                          "pretrain-long-fmnist", "pretrain-longer-fmnist",
                                          "teachers-1000-heads-fmnist", "pate-1000-heads-fixmatch-eps1-q500-fmnist",
                                          "pate-1000-heads-fixmatch-eps1-q1000-fmnist",
                                          "pate-1000-heads-fixmatch-eps1-q1000-m1.5-fmnist", "teachers-500-heads-fmnist",
                                          "pate-500-heads-fixmatch-eps1-q300-fmnist",
                                          "teachers-1000-heads-long-fmnist",
                                          "pate-1000-heads-long-fixmatch-eps1-q500-fmnist",
                                          "pate-1000-heads-long-fixmatch-posterior-eps1-q500-fmnist",
                                          "teachers-1000-heads-longer-fmnist",
                                          "pate-1000-heads-longer-fixmatch-posterior-eps1-q500-fmnist",
                                          "teachers-100-heads-longer-fmnist",
                                          "pate-100-heads-longer-fixmatch-posterior-eps10-q500-fmnist",
                                          "pate-100-heads-longer-fixmatch-posterior-eps10-q1000-fmnist",
                                          "teachers-100-pretrained-longer-fmnist",
                                          "pate-100-pretrained-longer-fixmatch-posterior-eps10-q500-fmnist"]
    # The encoder a row's teachers start from comes too, before them.
    assert names("teachers-250-pretrained-*") == ["pretrain-fmnist", "teachers-250-pretrained-fmnist"]
    assert names("teachers-1000-heads-fmnist") == ["pretrain-fmnist", "teachers-1000-heads-fmnist"]
    assert names("pate-1000-heads-long-*") == ["pretrain-long-fmnist", "teachers-1000-heads-long-fmnist",
                                               "pate-1000-heads-long-fixmatch-eps1-q500-fmnist",
                                               "pate-1000-heads-long-fixmatch-posterior-eps1-q500-fmnist"]
    assert names("dpsgd-encoder-*-eps1-*") == ["pretrain-long-fmnist", "dpsgd-encoder-head-eps1-fmnist",
                                               "dpsgd-encoder-all-eps1-fmnist"]  # trains on the data, from the encoder
    probe = next(run for run in runs if run.name == "dpsgd-encoder-head-eps1-fmnist")
    assert ("--train-layers", "head") == probe.args[probe.args.index("--train-layers"):][:2]
    margin = next(run for run in runs if run.name == "pate-1000-heads-fixmatch-eps1-q1000-m1.5-fmnist")
    assert margin.args[-2:] == ("--vote-margin", "1.5")
    soft = next(run for run in runs if run.name == "pate-1000-heads-long-fixmatch-posterior-eps1-q500-fmnist")
    assert soft.args[-2:] == ("--answer-targets", "posterior") and "--vote-margin" not in soft.args
    longer = next(run for run in runs if run.name == "pretrain-longer-fmnist")
    assert longer.args == ("--steps", "4800")
    soft10 = next(run for run in runs if run.name == "pate-250-pretrained-fixmatch-posterior-eps10-q2000-fmnist")
    plain10 = next(run for run in runs if run.name == "pate-250-pretrained-fixmatch-eps10-q2000-fmnist")
    assert soft10.args == (*plain10.args, "--answer-targets", "posterior")  # the same answers, other targets
    assert (soft10.teacher, soft10.encoder) == (plain10.teacher, plain10.encoder)
    heads10 = next(run for run in runs if run.name == "pate-100-heads-longer-fixmatch-posterior-eps10-q500-fmnist")
    assert heads10.args[:4] == ("--epsilon", "10", "--queries", "500")
    assert (heads10.teacher, heads10.encoder) == ("teachers-100-heads-longer-fmnist", "pretrain-longer-fmnist")
    assert names("teachers-100-pretrained-longer-*") == ["pretrain-longer-fmnist",
                                                         "teachers-100-pretrained-longer-fmnist"]


def test_each_data_set_has_one_public_pool_that_leaves_half_its_test_split_for_accuracy():
    from dpdistill.defaults import PUBLIC_POOL_SIZE
    from dpdistill.methods.pate import PateConfig

    harness = benchmark_harness()
    assert harness.DEFAULT_POOL == PUBLIC_POOL_SIZE and PateConfig(epsilon=1.0).public_size is None  # the default
    test_split = {"fmnist": 10_000, "mnist": 2_000}  # the 10,000-image MNIST set keeps 2,000 for testing

    def option(run, name: str) -> int | None:
        return int(run.args[run.args.index(name) + 1]) if name in run.args else None

    readers = [run for run in harness.table(("fmnist", "mnist"), 1)  # a sample source replaces the pool
               if (run.command in ("pate", "pretrain") or run.name.startswith("dpsgd-encoder")) and not run.sample_source]
    assert {run.dataset for run in readers} == {"fmnist", "mnist"}
    for run in readers:
        pool = option(run, "--public-size") or harness.DEFAULT_POOL
        assert pool == test_split[run.dataset] // 2, run.name
        if run.command == "pate":  # answers in proportion to the pool (MNIST: a fifth as many): the same share
            answers = option(run, "--queries")
            assert answers <= pool and f"-q{answers}" in run.name and run.group.endswith(f"{answers:,} answers")
    names = {run.name for run in readers}
    assert {"pate-250-eps10-q2000-fmnist", "pate-250-eps10-q400-mnist"} <= names


@pytest.mark.slow
def test_an_interrupted_row_is_resumed_and_marked_and_feeds_the_rows_that_read_it(tmp_path: Path):
    import pytest

    from dpdistill.jobs import train_teacher_ensemble
    from dpdistill.training.teacher import TeacherConfig

    harness = benchmark_harness()
    directory = tmp_path / "bench" / "teachers-10-digits" / "seed0"

    def stop(record: dict) -> None:
        if record.get("member") == 4:  # a member's own epochs come as records of its phase
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # the row's own settings (quick pass), stopped after four members
        train_teacher_ensemble("digits", directory, TeacherConfig(epochs=1, min_steps=10), 10, progress=stop)
    markdown = tmp_path / "BENCHMARKS.md"
    assert harness.main(["--quick", "--datasets", "digits", "--only", "pate-10-eps1-*", "--out",
                         str(tmp_path / "bench"), "--markdown", str(markdown)]) == 0
    assert json.loads((directory / "measured.json").read_text())["resumed"] is True
    assert len(json.loads((directory / "report.json").read_text())["members"]) == 10
    assert "(resumed: last part)" in (tmp_path / "bench" / "results.md").read_text()
    pate = json.loads((tmp_path / "bench" / "pate-10-eps1-q200-digits" / "seed0" / "report.json").read_text())
    assert pate["privacy"]["teachers"] == 10 and 0.99 < pate["privacy"]["epsilon"] <= 1


def test_the_headline_names_rows_of_the_table_and_stays_a_short_report():
    harness = benchmark_harness()
    names = {run.name for run in harness.table(("fmnist", "mnist"), 1)}
    chosen = [target.row for target in harness.TARGETS]
    chosen += [name.format(d=d) for d in ("fmnist", "mnist") for *_, names_ in harness.ROUTES for name in names_]
    chosen += [name.format(d=d) for d in ("fmnist", "mnist") for _, _, row, control in harness.PAPER_ROWS
               for name in (row, control) if name]
    # every target and paper row is a row of the table; a route may list a row one data set lacks, not both
    assert {target.row for target in harness.TARGETS} <= names
    assert all(name.format(d="fmnist") in names or name.format(d="mnist") in names
               for *_, names_ in harness.ROUTES for name in names_)
    assert [name for name in chosen if "{" in name] == []

    rows = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    relation = json.loads((ROOT / "benchmarks" / "relation.json").read_text())
    text = harness.render_headline(rows, False, "benchmarks/privacy_accuracy.png", "benchmarks/results.md", relation)
    assert len(text) <= harness.HEADLINE_LIMIT
    assert text.startswith(harness.BEGIN) and text.endswith(harness.END)
    assert "| `dpsgd-scatter-linear-eps1-fmnist` | 0,1,2 | 88.16 ± 0.08 | 0.9994 (add/remove) |" in text
    assert "| `dpsgd-scatter-linear-eps1-fmnist` | 0.999 | 2.119 |" in text  # the same row under replace-one
    assert "| DPSD data mode (seed 000) | 10 | `dpsd-data-paper-fmnist` | 90.08 | 10.61 ± 1.06 |" in text
    # BENCHMARKS.md as committed: the generated section is the published one, and the file a short report
    published = (ROOT / "BENCHMARKS.md").read_text()
    assert len(published) <= 25_000 and published.count(harness.BEGIN) == 1


def test_a_target_is_met_or_missed_by_its_gap():
    harness = benchmark_harness()
    row = {"run": "r", "dataset": "fmnist", "seeds": [0, 1], "accuracy_mean": 87.5, "accuracy_std": 0.5,
           "wall_seconds": 700.0, "privacy_mode": "none", "epsilon": None, "covered": None, "command": "",
           "paper_accuracy": None, "paper_epsilon": None}
    harness.TARGETS, saved = (harness.Target("accuracy", "r", 88), harness.Target("time", "r", 600, "wall"),
                              harness.Target("absent", "s", 1)), harness.TARGETS
    try:
        text = harness.render_headline([row], False, None, "results.md", {})
    finally:
        harness.TARGETS = saved
    assert "| accuracy | `r` | 0,1 | 87.50 ± 0.50 | missed by 0.50 points |" in text
    assert "| time | `r` | 0,1 | 700 s | missed by 100 s |" in text
    assert "| absent | `s` | — | not run | — |" in text


def test_a_route_on_a_sample_source_runs_after_its_source_and_its_teachers():
    harness = benchmark_harness()
    route = "pate-1000-heads-scatter-dpmerf-eps10-fmnist"
    chosen = [run.name for run in harness.select(harness.table(("fmnist",), 3), [route])]
    assert chosen == ["teachers-1000-heads-scatter-fmnist", "dpmerf-eps1-fmnist", route]


@pytest.mark.parametrize("row", ["dgd-paper-eps1-fmnist", "dgd-control-fmnist"])
def test_faithful_dgd_and_its_control_run_after_the_ensemble_and_the_baseline(row):
    harness = benchmark_harness()
    chosen = [run.name for run in harness.select(harness.table(("fmnist",), 3), [row])]
    assert chosen == ["teacher-fmnist", "teachers-250-heads-scatter-fmnist", row]


def test_every_dgd_row_states_settings_dgd_accepts():
    """A preset that gains a setting can leave a row's `--set` contradicting it, which fails only when the row runs
    (the supervised-student row did, for the paper preset's linear schedule): every row's settings are built here."""
    from dpdistill.methods.dgd import build_dgd_config, parse_dgd_assignments

    harness = benchmark_harness()
    rows = [run for run in harness.table(("fmnist", "mnist"), 3) if run.command == "dgd"]
    assert len(rows) >= 10
    for run in rows:
        given = dict(zip(run.args[::2], run.args[1::2]))
        assert set(given) <= {"--preset", "--epsilon", "--set"}, run.name
        sets = [value for flag, value in zip(run.args[::2], run.args[1::2]) if flag == "--set"]
        epsilon = float(given["--epsilon"]) if "--epsilon" in given else None
        build_dgd_config(epsilon, "baseline" if run.baseline else None, "source" if run.sample_source else None,
                         {**parse_dgd_assignments(sets), "accept_noise": True}, given.get("--preset"))
