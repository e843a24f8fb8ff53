"""gpulab.course.predict: the learner's prediction beside the formula and the measurement."""
import pytest

from gpulab.course.predict import line


def test_a_prediction_within_tolerance_prints_one_line_with_the_ratio():
    text = line("copy (ms)", measured=1.02, formula=1.0, mine=1.0, tolerance=0.05)
    assert text == ("copy (ms): your prediction 1 | formula 1 | measured 1.02 | "
                    "measured/yours 1.020")


def test_a_gap_over_tolerance_is_explained():
    text = line("peak (MiB)", measured=74.0, formula=73.5, mine=73.5, tolerance=0.001,
                gap="the allocator kept the block whole")
    assert "gap over the ±0.1% tolerance: the allocator kept the block whole" in text
    assert text.count("\n") == 1   # the formula is off too, so no "recheck your working"


def test_a_wrong_prediction_is_told_apart_from_a_wrong_formula():
    text = line("peak (MiB)", measured=128.3, formula=128.1, mine=64.0, tolerance=0.02, gap="g")
    assert "measured/yours 2.005" in text and "recheck your own working" in text


@pytest.mark.parametrize("mine", [None, ..., "12", float("nan"), True])
def test_no_usable_prediction_falls_back_to_the_formula_and_says_so(mine):
    text = line("bytes", measured=2.0, formula=2.0, mine=mine)
    assert "none yet, the formula stands in" in text and "measured/formula 1.000" in text


def test_large_numbers_print_with_thousands_separators():
    assert "measured 77,594,624" in line("bytes", 77_594_624, 77_070_336, None, tolerance=0.01)


def test_zero_predicted_and_zero_measured_agree():
    assert line("GPUs", 0, 0, 0).endswith("measured/yours 1.000")


def test_a_unit_follows_each_number():
    text = line("x", 10.2, 10, 10, tolerance=0.05, unit=" B")
    assert text == "x: your prediction 10 B | formula 10 B | measured 10.2 B | measured/yours 1.020"


def test_without_a_formula_the_prediction_alone_is_compared():
    assert "formula n/a" in line("x", 3, None, 3) and line("x", 3, None, 3).endswith("yours 1.000")
    nothing = line("x", 3, None, None)
    assert "none yet (no formula" in nothing and "gap" not in nothing


def test_five_digit_numbers_print_in_full():
    assert "measured 68,480" in line("bytes", 68_480, 68_480, None)


def test_a_table_marks_only_the_rows_outside_their_tolerance_and_explains_them():
    from gpulab.course.predict import Row, table
    text = table([Row("all-reduce", 3, 3), Row("all-gather", 1, 1, mine=1),
                  Row("broadcast", 2.0, 1.0, mine=1.0, tolerance=0.1, gap="a slow link")])
    rows = text.splitlines()
    assert rows[0].split() == ["yours", "formula", "measured", "ratio"]
    assert rows[1].split() == ["all-reduce", "-", "3", "3", "1.000"]
    assert rows[3].split()[-2:] == ["2.000", "◀"] and "◀" not in rows[1] + rows[2]
    assert "◀ broadcast: off by more than ±10%: a slow link" in text
    assert "ratio = measured / your prediction" in text and "none yet" not in text


def test_a_table_without_predictions_says_so_once_and_that_all_agree():
    from gpulab.course.predict import Row, table
    text = table([Row(f"collective {i}", 3, 3) for i in range(12)])
    assert len(text.splitlines()) == 1 + 12 + 2
    assert text.count("No prediction of yours yet") == 1 and "Every row is within its tolerance." in text


def test_a_prediction_that_agrees_with_the_formula_is_not_sent_back_to_its_working():
    from gpulab.course.predict import Row, line, table
    # chapter 07's ladder: prediction 1.5, formula 1.577 (5% apart), measured 1.877
    row = Row("speed-up", 1.877, 1.577, mine=1.5, tolerance=0.2)
    assert row.outside and not row.formula_matches
    assert "recheck" not in line("speed-up", 1.877, 1.577, 1.5, tolerance=0.2)
    assert "recheck" not in table([row])
    assert Row("speed-up", 1.6, 1.577, mine=1.0, tolerance=0.2).formula_matches
