"""Chapter 12, the capstone (gpulab.capstone): budgets that hold what the chapter says, plans read
strictly, runs that measure what the chapter predicts, a result file read trusting nothing, and
grading that judges a plan by a measurement of its own, outside the learner's kernel."""
import json
import math
import sys
from pathlib import Path

import nbformat
import pytest

from gpulab.capstone import budget as budgets
from gpulab.capstone import grading, results, run
from gpulab.capstone import plan as plans
from gpulab.capstone.plan import Plan, PlanError
from gpulab.course import variants
from gpulab.course.checks import (RECORD_MIME, Item, WrongAnswer, decode_selfcheck,
                                  encode_selfcheck, import_key, judge)

ROOT = Path(__file__).resolve().parent.parent
KEY = import_key(ROOT / "autograder" / "keys" / "12_capstone.py")
A = budgets.CANONICAL
GOOD = "micro_batch=6 accumulation=4 optimizer=adamw_fused workers=4"      # budget A's worked plan


# ------------------------------------------------------------------------------------------
# Plans


def test_a_plan_reads_its_config_line_and_writes_it_back():
    plan = Plan.parse("micro_batch=4, accumulation=6  workers=2")
    assert plan == Plan(4, 6, workers=2) and plan.global_batch == 24
    assert plan.text() == ("micro_batch=4 accumulation=6 precision=fp32 checkpointing=off "
                           "optimizer=adamw workers=2")
    assert Plan.parse(plan.text()) == plan
    assert plans.naive(A) == Plan(24, 1)


@pytest.mark.parametrize("text, says", [
    ("", "empty"),
    ("micro_batch=4", "needs accumulation"),
    ("micro_batch=4 accumulation=1 micro_batch=2", "given twice"),
    ("micro_batch=0 accumulation=1", "from 1 to 256"),
    ("micro_batch=4 accumulation=1 workers=9", "from 0 to 8"),
    ("micro_batch=4 accumulation=1 precision=fp16", "precision must be one of fp32, bf16"),
    ("micro_batch=4 accumulation=1 lr=3", "not a knob"),
    ("micro_batch=4 accumulation=1 checkpointing=<script>", "not a key=value pair"),
    ("micro_batch=99999 accumulation=1", "whole number"),
    ("micro_batch=4 accumulation=one", "whole number"),
    ("x" * 201, "at most 200 characters"),
    (4, "a line of text"),
])
def test_a_plan_that_cannot_be_read_says_why(text, says):
    with pytest.raises(PlanError, match=says):
        Plan.parse(text)


def test_the_step_time_model_adds_without_workers_and_takes_the_slower_stage_with_them():
    factor = plans.recompute_factor(Plan(12, 2, checkpointing="every"), A)
    assert 1.1 < factor < 1.25                         # chapter 05: early stop, about a fifth
    assert plans.step_seconds(Plan(6, 4), A, 0.1) == pytest.approx(0.35)         # 2.5 C + C
    assert plans.step_seconds(Plan(6, 4, workers=2), A, 0.1) == pytest.approx(0.125)
    assert plans.step_seconds(Plan(6, 4, workers=4), A, 0.1) == pytest.approx(0.1)
    assert plans.step_seconds(Plan(12, 2, checkpointing="every", workers=4), A, 0.1) == \
        pytest.approx(0.1 * factor)
    assert plans.workers_needed(Plan(6, 4), A) == 3
    assert "micro-batches of 6: global batch 24" in plans.training_script(Plan(6, 4))


# ------------------------------------------------------------------------------------------
# Budgets


def _divisors_above(n: int, m: int) -> list[int]:
    return [d for d in range(m + 1, n + 1) if n % d == 0]


def test_every_budget_holds_what_the_chapter_says():
    """The naive run is over; each quiz's "largest micro-batch" has 3% of headroom both ways
    and is at least 3; a plan of one pass per step fits; the tiers need workers and leave
    headroom; tokens per step differ; Quiz 9's rounding slip is a slip."""
    tokens = set()
    for b in budgets.BUDGETS:
        assert plans.predicted_peak_bytes(plans.naive(b), b) > 1.1 * b.memory_bytes, b.name
        for checkpointing in (False, True):
            micro = KEY.largest_dividing(b, checkpointing)
            mode = "every" if checkpointing else "off"
            assert micro >= 3 and b.batch % micro == 0, b.name
            peak = plans.predicted_peak_bytes(Plan(micro, b.batch // micro, checkpointing=mode), b)
            assert peak <= 0.97 * b.memory_bytes, (b.name, checkpointing)
            for bigger in _divisors_above(b.batch, micro)[:1]:
                over = plans.predicted_peak_bytes(Plan(bigger, b.batch // bigger, checkpointing=mode), b)
                assert over >= 1.03 * b.memory_bytes, (b.name, checkpointing)
        assert KEY.largest_dividing(b, False) < b.batch < 2 * KEY.largest_dividing(b, True) * b.batch
        one_pass = [Plan(b.batch, 1, checkpointing="every"), Plan(b.batch, 1, precision="bf16"),
                    Plan(b.batch, 1, precision="bf16", checkpointing="every")]
        assert min(plans.predicted_peak_bytes(p, b) for p in one_pass) <= 0.97 * b.memory_bytes
        assert 1.1 < b.speedup < b.fast < 0.6 * (1 + b.load_share), b.name
        assert math.ceil(b.load_share) != math.floor(b.load_share)
        assert b.tokens_per_step not in tokens
        tokens.add(b.tokens_per_step)
        assert grading.plan_problem(GOOD if b is A else
                                    f"micro_batch={KEY.largest_dividing(b, False)} accumulation="
                                    f"{b.batch // KEY.largest_dividing(b, False)} workers=5", b) is None
    assert budgets.CANONICAL is budgets.BUDGETS[0] and budgets.budget_named("C").batch == 24
    with pytest.raises(KeyError):
        budgets.budget_named("Z")


def test_your_budget_is_drawn_as_your_quizzes_numbers_are(tmp_path, monkeypatch):
    """Self-study: the chapter's own budget. A graded release with a seed: the one drawn for the
    student's id, the same one the grader judges their plan against."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPULAB_STUDENT", "ada")
    assert budgets.mine() is budgets.CANONICAL
    (tmp_path / variants.VARIANTS_FILE).write_text(json.dumps(
        {"chapter": "12_capstone", "seed": "fall-2026",
         "params": {name: list(p.values) for name, p in KEY.PARAMS.items()}, "questions": {}}))
    drawn = {}
    for student in ("ada", "bob", "cy", "dee", "eve"):
        monkeypatch.setenv("GPULAB_STUDENT", student)
        drawn[student] = budgets.mine().name
        items, _ = variants.student_key(KEY, "fall-2026", student, "12_capstone")
        assert {i.id: i for i in items}["12-run-fits"].judge_args == drawn[student]
    assert len(set(drawn.values())) >= 2
    # Graded: the kernel runs in autograded/<student>/12_capstone, and draws for that folder.
    folder = tmp_path / "autograded" / "bob" / "12_capstone"
    folder.mkdir(parents=True)
    (folder / variants.VARIANTS_FILE).write_text((tmp_path / variants.VARIANTS_FILE).read_text())
    monkeypatch.chdir(folder)
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setenv("GPULAB_STUDENT", "eve")
    assert budgets.mine().name == drawn["bob"]


# ------------------------------------------------------------------------------------------
# Memory and time, measured


def test_each_fix_measures_as_predicted():
    """The plan's knobs reach the prediction and the measurement alike: accumulation (its
    gradients alive), the fused optimizer, bf16 and checkpointing (the naive run is measured in
    the chapter's Experiment 1 and in test_a_run_times_only_what_fits)."""
    for plan in (Plan(6, 4, optimizer="adamw_fused"), Plan(24, 1, precision="bf16", checkpointing="every")):
        measured, method = run.peak_bytes(plan, A, "cpu")
        assert measured == pytest.approx(plans.predicted_peak_bytes(plan, A), rel=0.005), plan
    assert "tracker" in method


def test_a_run_times_only_what_fits_and_workers_hide_the_loading():
    """A budget small enough to run in about a second, whose loading is twelve times the naive
    compute: waiting needs no core, so what the workers hide is measured whatever else the
    machine is doing (about 13 / 12 = 1.1x without workers, up to 13 / 3 = 4.3x with four).
    Over the budget or off the target, nothing is timed."""
    def tiny(memory_mib: float) -> budgets.Budget:
        return budgets.Budget("T", n_layer=1, n_embd=32, seq=16, batch=8, memory_mib=memory_mib,
                              load_share=12.0, speedup=1.5, fast=2.0)

    sizing = tiny(1)
    between = (plans.predicted_peak_bytes(plans.naive(sizing), sizing)
               + plans.predicted_peak_bytes(Plan(4, 2), sizing)) / 2 / 2**20
    budget = tiny(between)
    over = run.measure(plans.naive(budget), budget, steps=2, device="cpu")
    assert not over["in_budget"] and over["step_s"] is None and over["naive_step_s"] is None
    assert "over the budget" in over["why"]
    off = run.measure(Plan(2, 2, workers=2), budget, steps=2, device="cpu")
    assert not off["in_budget"] and "the target is 8" in off["why"] and off["step_s"] is None
    waiting = run.measure(Plan(4, 2), budget, steps=3, device="cpu")
    hidden = run.measure(Plan(4, 2, workers=4), budget, steps=3, device="cpu")
    assert waiting["in_budget"] and hidden["in_budget"]
    assert waiting["speedup"] < 1.25 < 1.5 < hidden["speedup"], (waiting["speedup"], hidden["speedup"])
    assert len(hidden["plan_steps_s"]) == 3 and len(hidden["naive_steps_s"]) == 3
    assert hidden["latency_per_sequence_s"] == pytest.approx(12.0 * hidden["naive_compute_s"] / 8)


def test_a_fresh_process_is_asked_once_and_its_failure_is_said(monkeypatch):
    calls = []

    class Done:
        returncode, stderr = 0, ""
        stdout = "torch says hello\n" + json.dumps({"speedup": 2.0})

    def fake_run(command, **kwargs):
        calls.append((command, kwargs))
        return Done()

    monkeypatch.setattr(run, "_measured", {})
    monkeypatch.setattr(run.subprocess, "run", fake_run)
    plan = Plan(6, 4)
    assert run.measure_in_fresh_process(plan, A, user=65534)["speedup"] == 2.0
    assert run.measure_in_fresh_process(plan, A)["speedup"] == 2.0
    assert len(calls) == 1 and calls[0][0][-3:] == [plan.text(), "A", str(run.STEPS)]
    assert calls[0][0][1:3] == ["-m", "gpulab.capstone.run"] and calls[0][1]["user"] == 65534
    Done.returncode, Done.stderr, Done.stdout = 1, "Traceback: boom", ""
    with pytest.raises(RuntimeError, match="boom"):
        run.measure_in_fresh_process(Plan(12, 2), A)


# ------------------------------------------------------------------------------------------
# The result file


def _measurement(**changes) -> dict:
    m = {"plan": Plan(6, 4, workers=4).text(), "budget": "A", "device": "cpu", "peak_bytes": 22 * 2**20,
         "naive_peak_bytes": 54 * 2**20, "step_s": 0.5, "naive_step_s": 1.75, "tokens_per_s": 3072.0,
         "naive_tokens_per_s": 878.0, "speedup": 3.5, "in_budget": True, "why": ""}
    return {**m, **changes}


def test_the_result_file_keeps_each_run_and_reads_it_back(tmp_path):
    results.record(_measurement(), tmp_path)
    results.record(_measurement(plan=plans.naive(A).text(), peak_bytes=54 * 2**20, step_s=None,
                                naive_step_s=None, tokens_per_s=None, naive_tokens_per_s=None,
                                speedup=None, in_budget=False, why="over the budget"), tmp_path)
    runs = results.history(tmp_path)
    assert [r.in_budget for r in runs] == [True, False] and runs[0].meets_time
    table = results.history_table(runs)
    assert "meets both budgets" in table and "over budget" in table and "3.50x" in table
    assert results.history(tmp_path / "nowhere") == []


def _line(**changes) -> str:
    run_ = results.run_of(_measurement())
    data = {**run_.__dict__, **changes}
    return json.dumps(data)


@pytest.mark.parametrize("line", [
    _line(extra="x"),                                        # a key a run does not have
    json.dumps({k: v for k, v in json.loads(_line()).items() if k != "why"}),
    _line(speedup=float("nan")).replace("NaN", "NaN"),       # JSON's NaN: not a measurement
    _line(speedup=1e300), _line(speedup=-2.0), _line(speedup="99"), _line(speedup=True),
    _line(in_budget=1), _line(budget="Z"), _line(plan="micro_batch=6 accumulation=4 rm=1"),
    _line(plan="<script>alert(1)</script>"), _line(device="x" * 301), _line(why=["a"]),
    "[" * 10_000 + "]" * 10_000,                             # deep nesting: refused, not raised
    "not json", "[]", _line(why="x" * 250) + " " * 2000,     # a line over the length limit
])
def test_a_line_that_is_not_a_run_is_refused(line):
    assert results.parse_line(line) is None


def test_the_result_file_is_read_within_its_limits():
    good = _line()
    runs, refused = results.parse_runs(("junk\n" + good + "\n").encode())
    assert len(runs) == 1 and refused == 1
    assert results.parse_line(good).plan == Plan(6, 4, workers=4).text()
    many = ((good + "\n") * (results.MAX_RUNS + 50)).encode()
    assert len(results.parse_runs(many)[0]) == results.MAX_RUNS
    huge = b"x" * (results.MAX_FILE_BYTES + 1)
    assert results.parse_runs(huge) == ([], 1)


# ------------------------------------------------------------------------------------------
# Grading: the plan's text, and a measurement of the judge's own


def _item(item_id: str) -> Item:
    return {item.id: item for item in KEY.ITEMS}[item_id]


@pytest.fixture
def measured(monkeypatch):
    """The grader's measurement, replaced: the plans it is asked for, and what it answers."""
    asked, answer = [], {"speedup": 1.0, "in_budget": True, "why": "", "peak_bytes": 22 * 2**20,
                         "device": "cpu"}

    def measure(plan, budget, steps=run.STEPS, **kwargs):
        asked.append((plan.text(), budget.name))
        return dict(answer)

    monkeypatch.setattr(run, "measure_in_fresh_process", measure)
    return asked, answer


def test_the_judge_reads_the_plan_and_its_own_measurement_only(tmp_path, monkeypatch, measured):
    """A result file beside the notebook claiming 99x changes nothing: the judge never reads
    it. Below the time budget the plan fits but is too slow; at the bonus tier it passes all."""
    asked, answer = measured
    monkeypatch.chdir(tmp_path)
    (tmp_path / results.RESULT_FILE).write_text(_line(speedup=99.0) + "\n")
    assert "measured peak 22.00 MiB" in judge(_item("12-run-fits"), GOOD)
    with pytest.raises(WrongAnswer, match="1.00x as fast as the naive run.*the time budget is 1.4x"):
        judge(_item("12-run-time"), GOOD)
    answer["speedup"] = A.fast + 0.05
    for item_id in grading.ITEMS:
        assert judge(_item(item_id), GOOD).startswith(f"✔ {item_id}")
    assert set(asked) == {(Plan.parse(GOOD).text(), "A")}
    answer.update(in_budget=False, why="its measured peak is 23.10 MiB, over the budget of 23 MiB")
    with pytest.raises(WrongAnswer, match="23.10 MiB, over the budget"):
        judge(_item("12-run-fits"), GOOD)


def test_a_time_tier_keeps_the_fastest_of_three_measurements(monkeypatch):
    """A busy machine only slows a run down: a plan short of a tier is measured again, up to
    three times, and the fastest counts; one that reaches it, or is over budget, is not."""
    speedups, asked = [1.0, 2.0, 1.5], []

    def measure(plan, budget, steps=run.STEPS, attempt=0, **kwargs):
        asked.append(attempt)
        return {"speedup": speedups[attempt], "in_budget": True, "why": "", "peak_bytes": 2**20,
                "device": "cpu"}

    monkeypatch.setattr(run, "measure_in_fresh_process", measure)
    assert grading.measurement(Plan.parse(GOOD), A, wanted=1.75)["speedup"] == 2.0 and asked == [0, 1]
    asked.clear()
    assert grading.measurement(Plan.parse(GOOD), A, wanted=2.5)["speedup"] == 2.0 and asked == [0, 1, 2]
    asked.clear()
    assert grading.measurement(Plan.parse(GOOD), A)["speedup"] == 1.0 and asked == [0]


def test_a_plan_that_cannot_meet_the_budget_is_wrong_without_a_run(measured):
    asked, _ = measured
    for item_id in grading.ITEMS:
        item = _item(item_id)
        for mistake in item.mistakes:
            with pytest.raises(WrongAnswer, match="global batch|predicted peak"):
                judge(item, mistake.value)
        for answer, says in ((..., "not answered yet"), (3.5, "line of text"),
                             ("micro_batch=6 accumulation=4 lr=1", "not a knob")):
            with pytest.raises(WrongAnswer, match=says):
                judge(item, answer)
    assert asked == []


def test_a_failed_measurement_scores_nothing(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the measuring process failed (exit 1): out of memory")

    monkeypatch.setattr(run, "measure_in_fresh_process", broken)
    with pytest.raises(WrongAnswer, match="the run of your plan failed.*out of memory"):
        judge(_item("12-run-fits"), GOOD)


def test_grading_outside_the_kernel_judges_the_recorded_plan(tmp_path, measured):
    """GradeRecordedAnswers alone, as `make autograde` runs it after the sandboxed kernel: the
    record of a plan's text is judged by the grader's measurement, for the budget drawn from the
    submission folder's student; what else the notebook printed counts for nothing, and a
    number recorded where a plan belongs, or two records, score zero."""
    sys.path.insert(0, str(ROOT / "autograder"))
    from secure_grading import GradeRecordedAnswers

    asked, answer = measured
    answer["speedup"] = 9.0

    def graded(records: list[dict], seed: str = "", student: str = "ada") -> nbformat.NotebookNode:
        boast = nbformat.v4.new_code_cell("print('speed-up 99.0x, peak 1 MiB')")
        boast.outputs = [nbformat.v4.new_output("stream", name="stdout", text="speed-up 99.0x\n")]
        test = nbformat.v4.new_code_cell('check("12-run-time", plan)')
        test.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "test-12-run-time"}
        test.outputs = [nbformat.v4.new_output("display_data", data={RECORD_MIME: r, "text/plain": "r"})
                        for r in records]
        resources = {"nbgrader": {"assignment": "12_capstone", "notebook": "12_capstone",
                                  "student": student, "db_url": f"sqlite:///{tmp_path / 'gradebook.db'}"}}
        grader = GradeRecordedAnswers(keys_dir=str(ROOT / "autograder" / "keys"), course_seed=seed)
        return grader.preprocess(nbformat.v4.new_notebook(cells=[boast, test]), resources)[0].cells[1]

    plan_record = {"item": "12-run-time", "text": GOOD}
    assert graded([plan_record]).outputs[0]["output_type"] == "stream"
    assert asked == [(Plan.parse(GOOD).text(), "A")]
    assert graded([{"item": "12-run-time", "value": 99.0}]).outputs[0]["output_type"] == "error"
    assert "more than one" in graded([plan_record, plan_record]).outputs[0]["evalue"]
    # With a seed, bob's own budget: another target global batch, so budget A's plan is wrong.
    bob = {i.id: i for i in variants.student_key(KEY, "fall-2026", "bob", "12_capstone")[0]}
    assert budgets.budget_named(bob["12-run-time"].judge_args).batch != A.batch
    failed = graded([plan_record], seed="fall-2026", student="bob").outputs[0]
    assert failed["output_type"] == "error" and "the target is" in failed["evalue"]
    assert len(asked) == 1                                   # judged without a run


def test_a_judged_item_names_a_gpulab_judge_and_encodes_only_when_it_has_one():
    import base64
    import zlib

    def data_of(text: str) -> dict:
        body = "".join(line for line in text.splitlines() if " " not in line)
        return json.loads(zlib.decompress(base64.b64decode(body)))

    with pytest.raises(ValueError, match="gpulab function"):
        Item("12-x", "a plan", "", judged_by="os:system")
    judged = {"12-run-fits": _item("12-run-fits")}
    assert decode_selfcheck(encode_selfcheck(judged)) == judged
    assert "judged_by" not in data_of(encode_selfcheck({"01-a": Item("01-a", 1.0, "B")}))["01-a"]
    forged = data_of(encode_selfcheck(judged))                   # a self-check file edited by hand
    forged["12-run-fits"]["judged_by"] = "os:system"
    text = base64.b64encode(zlib.compress(json.dumps(forged).encode())).decode()
    with pytest.raises(ValueError, match="gpulab function"):
        decode_selfcheck(text)
