"""gpulab.course.checks and .diagnosis: verdicts, diagnostics that name the mistake (only where
that mistake is plausible), clear messages for bad input."""
import math

import numpy as np
import pytest
import torch

from gpulab.course import checks, diagnosis
from gpulab.course.checks import Item, Mistake, WrongAnswer, check, judge

BYTES = Item("99-bytes", 38_535_168, "bytes",
             mistakes=(Mistake(9_633_792, "4x too small: that is the number of elements."),))
GIB = Item("99-gib", 40e9 / 2**30, "GiB", rel_tol=0.005)
CHOICE = Item("99-bound", "memory", "", choices=("compute", "memory"),
              mistakes=(Mistake("compute", "at this intensity the roof is the bandwidth."),))


def wrong(item, answer) -> str:
    with pytest.raises(WrongAnswer) as info:
        judge(item, answer)
    return str(info.value)


def test_right_answers_pass_and_say_so():
    assert judge(BYTES, 64 * 3 * 224 * 224 * 4).startswith("✔ 99-bytes: right")
    assert "within 0.5%" in judge(GIB, 37.3)            # 37.25 rounded by the learner
    assert judge(BYTES, np.int64(38_535_168))            # numpy scalars are fine numbers
    assert judge(CHOICE, " Memory ").startswith("✔")


def test_exact_items_reject_near_misses():
    assert "close, but too large" in wrong(BYTES, 38_535_169 * 1.001)


def test_item_specific_mistake_wins_over_generic_ratio():
    assert wrong(BYTES, 9_633_792) == "99-bytes: 4x too small: that is the number of elements."


@pytest.mark.parametrize("factor, words", [
    (8, "bits instead of bytes"),
    (1 / 8, "8x too small"),
    (1000, "1000x too large"),
    (1e-3, "1000x too small"),
    (2, "2x too large"),
    (1024, "1024x too large"),
    (-1, "sign is wrong"),
    (37, "more than 10x"),
    (3, "between 2x and 10x"),
])
def test_generic_diagnostics_name_the_slip(factor, words):
    assert words in wrong(BYTES, 38_535_168 * factor)


def test_gb_vs_gib_is_named():
    assert "10^9 (GB)" in wrong(GIB, 40.0)               # 40e9 / 1e9 given where GiB was asked
    gb = Item("99-gb", 40.0, "GB", rel_tol=0.005)
    assert "2^30 (GiB)" in wrong(gb, 40e9 / 2**30)


def test_diagnostics_never_print_the_expected_value():
    for answer in [1, 38_535_168 * 3, 38_535_168 * 1.2]:
        message = wrong(BYTES, answer)
        assert "38535168" not in message.replace(",", "") and "36.75" not in message


@pytest.mark.parametrize("answer, words", [
    (..., "not answered yet"),
    (None, "is None"),
    ("38535168", "without quotes"),
    ("about forty", "the text"),
    (True, "yes/no"),
    ([1, 2], "a list"),
    ((1,), "a tuple"),
    (torch.tensor(38_535_168.0), ".item()"),
    (torch.ones(3), "shape (3,)"),
    (np.ones((2, 2)), "shape (2, 2)"),
    (float("nan"), "NaN"),
    (math.inf, "infinite"),
    (1 + 2j, "complex"),
    (object(), "not a number"),
])
def test_bad_input_gets_a_plain_words_message(answer, words):
    message = wrong(BYTES, answer)
    assert words in message and message.startswith("99-bytes:")


def test_choice_items():
    assert "not answered yet" in wrong(CHOICE, ...)
    assert "roof is the bandwidth" in wrong(CHOICE, "compute")
    assert "one of 'compute', 'memory'" in wrong(CHOICE, "latency")
    assert "one of" in wrong(CHOICE, 3)


def test_wrong_answer_is_an_assertion_shown_without_traceback():
    error = WrongAnswer("99-x: 8x too large")
    assert isinstance(error, AssertionError)
    assert error._render_traceback_() == ["\x1b[31m✘ 99-x: 8x too large\x1b[0m"]


def test_selfcheck_round_trip_is_deterministic_and_not_plain_text():
    items = {i.id: i for i in (BYTES, GIB, CHOICE)}
    text = checks.encode_selfcheck(items)
    assert text == checks.encode_selfcheck(dict(reversed(items.items())))
    assert checks.decode_selfcheck(text) == items
    assert "38535168" not in text and "number of elements" not in text


KEY_MODULE = '''
from gpulab.course.checks import Item
ITEMS = [Item("42-answer", 42, "units")]
'''


def test_key_lookup_order(tmp_path, monkeypatch, capsys):
    keys = tmp_path / "course" / "autograder" / "keys"
    keys.mkdir(parents=True)
    (keys / "42_topic.py").write_text(KEY_MODULE)
    notebook_dir = tmp_path / "course" / "solutions" / "42_topic"
    notebook_dir.mkdir(parents=True)
    monkeypatch.delenv(checks.KEYS_ENV, raising=False)

    # 3. an instructor in the repository: found by walking up
    monkeypatch.chdir(notebook_dir)
    check("42-answer", 42)
    assert "✔ 42-answer" in capsys.readouterr().out

    # 2. a self-study release: selfcheck.dat beside the notebook wins
    forged = checks.encode_selfcheck({"42-answer": Item("42-answer", 7, "units")})
    (notebook_dir / checks.SELFCHECK_FILE).write_text(forged)
    check("42-answer", 7)
    assert "✔" in capsys.readouterr().out

    # 1. grading: the instructor's folder wins over a file the student could have edited
    monkeypatch.setenv(checks.KEYS_ENV, str(keys))
    check("42-answer", 7)
    assert "✘ 42-answer" in capsys.readouterr().out
    with pytest.raises(KeyError, match="42-missing"):
        check("42-missing", 1)


def test_without_any_key_the_answer_is_only_recorded(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(checks.KEYS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    check("42-answer", 41)
    assert "recorded" in capsys.readouterr().out
    check("42-answer", ...)                          # shown, not raised: Run All goes on
    assert "○ 42-answer: not answered yet" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# Who sees a verdict how: a learner's Run All goes on; Validate and a strict build fail


@pytest.fixture
def self_study(tmp_path, monkeypatch):
    """A self-study release folder (selfcheck.dat beside the notebook) as the working folder."""
    monkeypatch.delenv(checks.KEYS_ENV, raising=False)
    monkeypatch.delenv(checks.STRICT_ENV, raising=False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    (tmp_path / checks.SELFCHECK_FILE).write_text(checks.encode_selfcheck({BYTES.id: BYTES}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("answer, shown", [
    (..., "○ 99-bytes: not answered yet. Replace the ... with your answer in bytes."),
    (9_633_792, "✘ 99-bytes: 4x too small: that is the number of elements."),
    ("many", "✘ 99-bytes: your answer is the text 'many'"),
    (38_535_168, "✔ 99-bytes: right (38,535,168 bytes)."),
])
def test_a_learner_sees_each_state_and_nothing_raises(self_study, capsys, answer, shown):
    check("99-bytes", answer)
    assert capsys.readouterr().out.startswith(shown)


@pytest.mark.parametrize("answer, says", [(..., "not answered yet"), (9_633_792, "number of elements")])
@pytest.mark.parametrize("env", [("NBGRADER_EXECUTION", "validate"), (checks.STRICT_ENV, "1")])
def test_validate_and_strict_builds_raise_on_wrong_or_unanswered(self_study, monkeypatch, env,
                                                                  answer, says):
    monkeypatch.setenv(*env)
    with pytest.raises(WrongAnswer, match=says):
        check("99-bytes", answer)
    check("99-bytes", 38_535_168)                    # a right answer passes Validate


def test_validate_without_a_key_still_fails_unanswered_items(tmp_path, monkeypatch, capsys):
    """The graded release has no key: Validate cannot judge a number, but it must not call an
    untouched notebook a success."""
    monkeypatch.delenv(checks.KEYS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    with pytest.raises(WrongAnswer, match="not answered yet"):
        check("42-answer", ...)
    with pytest.raises(WrongAnswer, match="is None"):
        check("42-answer", None)
    check("42-answer", 41)
    assert "recorded" in capsys.readouterr().out


def test_in_ipython_the_verdict_is_a_styled_box_not_an_error(self_study, monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.get_ipython", lambda: object())
    monkeypatch.setattr("IPython.display.display", lambda data, raw: shown.append(data))
    check("99-bytes", 9_633_792)
    html, = (d["text/html"] for d in shown)
    assert 'class="gpulab-check gpulab-check-wrong"' in html and "number of elements" in html
    assert shown[0]["text/plain"].startswith("✘ 99-bytes")


@pytest.mark.parametrize("rel_tol, words", [
    (0.005, "within 0.5%"), (0.0002, "within 0.02%"), (1e-5, "within 0.001%"),
    (0.001, "within 0.1%"), (0.01, "within 1%"), (0.125, "within 12.5%"),
])
def test_small_tolerances_are_printed_with_their_digits(rel_tol, words):
    item = Item("99-t", 100.0, "s", rel_tol=rel_tol)
    assert words in judge(item, 100.0)
    assert words in wrong(item, 100.0 * (1 + 3 * rel_tol))   # "close, but ..., needs within"


def test_missing_key_for_chapter_in_grading_folder_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(checks.KEYS_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no key for chapter 42"):
        check("42-answer", 42)


# --------------------------------------------------------------------------------------------
# Graded runs: check() only records; the verdict is computed outside the kernel


def test_a_graded_run_records_without_reading_any_key(monkeypatch, capsys, tmp_path):
    """Under nbgrader's autograde, even with a key reachable, check() judges nothing: it
    records the answer (here, outside IPython, it prints that it did)."""
    from gpulab.course.checks import check

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setenv("GPULAB_ANSWER_KEYS", str(tmp_path / "nowhere"))   # would raise if read
    check("01-anything", 12345)                                            # a wrong answer, no raise
    assert "answer recorded for grading" in capsys.readouterr().out


@pytest.mark.parametrize("answer, record", [
    (2048, {"value": 2048.0}),
    (True, {"error": "yes/no"}),
    ("2048", {"text": "2048"}),
    (..., {"error": "not answered yet"}),
    (float("nan"), {"error": "NaN"}),
    (None, {"error": "None"}),
    ([1, 2], {"error": "list"}),
])
def test_answer_record_keeps_only_a_plain_number_or_text(answer, record):
    from gpulab.course.checks import answer_record

    got = answer_record("99-x", answer)
    assert got["item"] == "99-x" and set(got) == {"item", *record}
    (kind, expected), = record.items()
    assert expected in got[kind] if kind == "error" else got[kind] == expected
    if kind == "value":
        assert type(got["value"]) is float


def test_an_object_equal_to_everything_records_as_no_number():
    from gpulab.course.checks import answer_record

    class Anything:
        def __eq__(self, other):
            return True

    class Liar(int):
        def __eq__(self, other):
            return True

    assert "not a number" in answer_record("99-x", Anything())["error"]
    assert answer_record("99-x", Liar(7)) == {"item": "99-x", "value": 7.0}


# --------------------------------------------------------------------------------------------
# Which slips a diagnosis may name: a unit slip only where a unit is involved, a counting or
# rounding slip for a whole number one off (issue 29: 15 for 14 steps was called GB vs GiB)

@pytest.mark.parametrize("unit, value, kind", [
    ("GB", 1.0, "prefixed bytes"), ("GiB", 1.0, "prefixed bytes"), ("GB/s", 1.0, "prefixed bytes"),
    ("MiB", 1.0, "prefixed bytes"), ("bytes", 1.0, "bytes"), ("bits", 1.0, "bytes"),
    ("ms", 1.0, "time"), ("µs", 1.0, "time"), ("h", 1.0, "time"), ("GPUs", 1.0, "count"),
    ("step", 1.0, "count"), ("sequences", 1.0, "count"), ("FLOPs", 1.0, "scaled"),
    ("tokens/kWh", 1.0, "scaled"), ("parameters", 1.0, "scaled"), ("%", 50.0, "percent"),
    ("", 0.41, "fraction"), ("", 2048.0, "plain"), ("x", 8.0, "plain"), ("x T", 2.0, "plain"),
])
def test_unit_kind(unit, value, kind):
    assert diagnosis.unit_kind(unit, value) == kind


UNIT_WORDS = ("GB", "GiB", "MiB", "MB", "TB", "TiB", "bits", "prefix", "bytes vs 4", "bytes per value")


@pytest.mark.parametrize("item_id, unit, value, answer, rel_tol", [
    ("08-first-inf-step", "step", 14, 15, 1e-9),       # the pairs issue 29 names
    ("05-sqrt-segment", "blocks", 10, 11, 1e-9),
    ("06-zero3-gpus", "GPUs", 13, 14, 1e-9),
    ("07-launch-bound-ms", "ms", 20.0, 21, 0.01),
    ("06-min-batch", "sequences", 10, 11, 1e-9),
    ("06-min-batch", "sequences", 4, 5, 1e-9),
    ("01-visible-count", "GPUs", 8, 7, 1e-9),
])
def test_a_whole_number_one_off_is_a_counting_or_rounding_slip(item_id, unit, value, answer, rel_tol):
    message = wrong(Item(item_id, value, unit, rel_tol=rel_tol), answer)
    assert ("counting slip" in message or "off by one" in message) and "round" in message, message
    assert not any(word in message for word in UNIT_WORDS), message


def test_a_unit_slip_is_named_only_where_a_unit_is_involved():
    gpus, gib, ms = Item("99-g", 1000, "GPUs"), Item("99-m", 40e9 / 2**30, "GiB"), Item("99-t", 20.0, "ms")
    assert "close, but too large" in wrong(gpus, 1074)            # 1.074 = 2^30/10^9 by accident
    assert "more than 10x" in wrong(gpus, 1_000_000)              # no prefix on a count of GPUs
    assert "a factor of two slipped in. Recheck" in wrong(gpus, 2000)
    assert "close, but too large" in wrong(ms, 21.0 * 1.0005)     # 5% is no MiB slip in ms
    assert "1000x too large: check the unit prefix" in wrong(ms, 20_000)
    assert "10^9 (GB)" in wrong(gib, 40.0)
    steps = Item("99-s", 28, "steps")
    assert "GiB" not in wrong(steps, 30) and "close, but" in wrong(steps, 30)   # 30/28 = 1.071


def test_a_rounded_unit_slip_is_offered_beside_the_one_off():
    """14 GiB answered 15 may be a GB-vs-GiB slip rounded to a whole number: say both."""
    message = wrong(Item("99-gib", 14, "GiB"), 15)
    assert "off by one" in message and "10^9 (GB)" in message


def test_small_numbers_two_apart_keep_the_factor_of_two():
    assert "2x too small" in wrong(Item("99-g", 2, "GPUs"), 1)
    assert "one too" not in wrong(Item("99-g", 2, "GPUs"), 1)


def test_percent_and_fraction_slips():
    assert "percentage given where a fraction" in wrong(Item("99-mfu", 0.41, "", rel_tol=0.01), 41)
    assert "fraction given where a percentage" in wrong(Item("99-u", 100.0, "%", rel_tol=0.01), 1.0)
    assert "percentage" not in wrong(Item("99-n", 2048, ""), 204_800)


def test_the_course_keys_give_a_one_off_the_counting_diagnosis():
    """Every whole-number item of every key (read-only: 05-08 belong to other chapters' owners),
    at its own numbers and at each value of each per-student parameter in turn: an answer one
    off that no typical mistake of the key names gets the counting or rounding diagnosis, never
    a unit slip; the items issue 29 names are among them."""
    from pathlib import Path
    from gpulab.course.checks import import_key
    from gpulab.course.variants import canonical

    keys = sorted((Path(__file__).resolve().parent.parent / "autograder" / "keys").glob("[0-9][0-9]_*.py"))
    checked = set()
    for path in keys:
        module = import_key(path)
        params = getattr(module, "PARAMS", {})
        numbers = [canonical(params)] + [{**canonical(params), name: value}
                                         for name, param in params.items() for value in param.values]
        for p in numbers:
            for item in (module.items(p) if params else module.ITEMS):
                if item.choices or item.judged_by or not diagnosis._whole(float(item.value)):
                    continue
                for answer in (round(item.value) - 1, round(item.value) + 1):
                    if max(abs(answer), abs(item.value)) < 3 or checks._close(answer, item.value, item):
                        continue
                    checked.add(item.id)
                    message = diagnosis.diagnose(answer, item)
                    if any(message == m.says for m in item.mistakes):
                        continue        # the key names this slip itself
                    assert message.startswith(("one too", "off by one")), (item.id, item.value, answer, message)
    assert {"08-first-inf-step", "05-sqrt-segment", "06-zero3-gpus", "07-launch-bound-ms",
            "06-min-batch"} <= checked
