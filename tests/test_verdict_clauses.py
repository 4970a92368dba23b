"""Each clause of each criterion fails alone: the verdict is fed the committed runs of a healthy folder with one
figure edited, as a run whose fault breaks that clause would write it, and FAIL names the clause's figure; no other
criterion fails but those that judge the same fact (docs/verdict-clauses.md lists them). Where a clause has a
bound, the same edit just inside it passes. No launch: the records are read from benchmarks/logs/."""
import copy
import dataclasses
import functools
import inspect
import re

import pytest

from zero3bench.reporting import reading, verdict
from conftest import ROOT

# the 1.3b model on 4 ranks rehearsed on one H200: every criterion PASSes, (b) judges the peak and (c) the design loss
HEALTHY = ROOT / "benchmarks/logs/h200/24-peaks/results/20261201-134046-6F1B"
CLAUSES = ROOT / "docs/verdict-clauses.md"


@functools.cache
def committed():
    return reading.load_runs(HEALTHY)


def healthy():
    """The folder's runs, a copy that a test may edit: {"stage0": [4 ranks], "stage3": [4 ranks]}."""
    return copy.deepcopy(committed())


def judged(runs):
    """{criterion's letter: its check} and the overall status."""
    checks, overall = verdict.verdict(runs)
    return {c.criterion[:3]: c for rows in checks.values() for c in rows}, overall


def fails_alone(runs, letter, figure, *also):
    """The check of `letter`, asserted to FAIL with `figure` (a pattern) in its sentence, and the verdict to FAIL
    with no other criterion failing but `also`."""
    checks, overall = judged(runs)
    check = checks[letter]
    assert check.status == "FAIL" and re.search(figure, check.detail), check.detail
    assert overall == "FAIL"
    assert {x for x, c in checks.items() if c.status == "FAIL"} == {letter, *also}, checks
    return check


def passes(runs):
    checks, overall = judged(runs)
    assert overall == "PASS", [c for c in checks.values() if c.status != "PASS"]


def every_rank(rs, edit):
    for r in rs:
        edit(r)


def with_losses(r, **at_step):
    """r's steps with the loss at step N set to at_step[f"s{N}"]."""
    r.steps = [dataclasses.replace(s, loss=at_step.get(f"s{s.step}", s.loss)) for s in r.steps]


def test_the_healthy_folder_passes_every_criterion():
    checks, overall = judged(healthy())
    assert overall == "PASS" and sorted(checks) == ["(a)", "(b)", "(c)", "(d)", "(e)"]
    assert all(c.status == "PASS" for c in checks.values())


# -----------------------------------------------------------------------------
# (a)


def test_a_stage_3_that_counted_no_partitioning_fails_a():
    runs = healthy()
    every_rank(runs["stage3"], lambda r: setattr(r, "shards", dataclasses.replace(r.shards, partitioned_tensors=None)))
    check = fails_alone(runs, "(a)", r"^stage 3 reported no partitioning$")
    assert check.figures.counted is False


@pytest.mark.parametrize("partitioned, tensors, told", [(291, 292, "291/292"), (0, 0, "0/0")],
                         ids=["one tensor whole", "no tensor at all"])
def test_a_rank_of_stage_3_that_leaves_a_tensor_whole_fails_a(partitioned, tensors, told):
    runs = healthy()
    ranks = runs["stage3"][2:] if tensors else runs["stage3"]
    every_rank(ranks, lambda r: setattr(r, "shards", dataclasses.replace(r.shards, partitioned_tensors=partitioned,
                                                                            param_tensors=tensors)))
    check = fails_alone(runs, "(a)", rf"stage 3 partitions {told} tensors \(shards checked: ok\)")
    assert check.figures.partitioned == partitioned


def test_a_rank_of_stage_3_whose_shards_have_wrong_sizes_fails_a():
    runs = healthy()
    runs["stage3"][3].shards = dataclasses.replace(runs["stage3"][3].shards, shard_check_ok=False)
    check = fails_alone(runs, "(a)", r"292/292 tensors \(shards checked: WRONG SIZES\)")
    assert check.figures.shards_ok is False


def test_a_rank_of_stage_0_that_partitions_a_tensor_fails_a():
    runs = healthy()
    runs["stage0"][3].shards = dataclasses.replace(runs["stage0"][3].shards, partitioned_tensors=1)
    check = fails_alone(runs, "(a)", r"\), stage 0 1;")
    assert check.figures.stage0_partitioned == 1


@pytest.mark.parametrize("apart", [1e-6, -1e-6])
def test_shards_whose_checksum_differs_from_stage_0s_fail_a(apart):
    runs = healthy()  # the checksum is summed across ranks: every rank's moves with one rank's shard
    every_rank(runs["stage3"], lambda r: setattr(r, "weights_checksum", r.weights_checksum * (1 + apart)))
    check = fails_alone(runs, "(a)", r"the shards do NOT hold stage 0's initial weights: their checksums are "
                                     r"1\.0e-06 apart \(at most 1e-09\)")
    assert check.figures.same_weights is False and check.figures.weights_gap == pytest.approx(1e-6, rel=1e-3)


def test_shards_whose_checksum_is_within_its_tolerance_of_stage_0s_pass_a():
    runs = healthy()
    every_rank(runs["stage3"], lambda r: setattr(r, "weights_checksum", r.weights_checksum * (1 + 0.9e-9)))
    passes(runs)


# -----------------------------------------------------------------------------
# (b), and the runs' finishing that (c) and (d) judge too


def test_a_stage_3_that_did_not_finish_fails_b_c_and_d():
    runs = healthy()
    every_rank(runs["stage3"], lambda r: setattr(r, "error", "RuntimeError: planted"))
    checks, overall = judged(runs)
    for letter in "(b)", "(c)":
        assert checks[letter].status == "FAIL" and checks[letter].detail == "stage 3 did not finish: error"
    assert checks["(d)"].status == "FAIL" and checks["(d)"].detail.endswith("FAILED: stage3 error")
    assert overall == "FAIL" and checks["(a)"].status != "FAIL" and "(e)" not in checks


def test_a_stage_0_that_failed_other_than_out_of_memory_fails_b_and_d():
    runs = healthy()
    every_rank(runs["stage0"], lambda r: setattr(r, "error", "RuntimeError: planted"))
    check = fails_alone(runs, "(b)", r"^stage 0 did not finish: error$", "(d)")
    assert check.figures.unfinished == "stage 0"


def more_states(r, factor):
    r.model_state_breakdown = dataclasses.replace(r.model_state_breakdown,
                                                  moments=r.model_state_breakdown.moments + int(
                                                      (factor - 1) * r.model_state_breakdown.states))


def test_a_rank_of_stage_3_holding_more_model_states_than_the_slack_allows_fails_b():
    runs = healthy()
    more_states(runs["stage3"][1], 1.26)
    check = fails_alone(runs, "(b)", r"model states per rank 19\.58 GiB -> 6\.1\d GiB \(3\.1\dx less, predicted "
                                     r"4\.00x less: MISSED\)")
    assert check.figures.states_ok is False and check.figures.states3 == runs["stage3"][1].model_state_bytes


def test_stage_3_holding_model_states_within_the_slack_passes_b():
    runs = healthy()
    more_states(runs["stage3"][1], 1.24)
    passes(runs)


def test_a_rank_of_stage_3_peaking_above_what_theory_allows_fails_b():
    runs = healthy()
    peak0 = runs["stage0"][0].peaks.peak_mem_bytes
    runs["stage3"][2].peaks = dataclasses.replace(runs["stage3"][2].peaks, peak_mem_bytes=int(peak0 / 3.4))
    check = fails_alone(runs, "(b)", r"peak 24\.54 GiB -> 7\.22 GiB \(3\.40x less, expected 3\.47x less or better: "
                                     r"MISSED: theory predicts 3\.99x less")
    assert check.figures.peak_ok is False


def test_stage_3_peaking_within_what_theory_allows_passes_b():
    runs = healthy()
    peak0 = runs["stage0"][0].peaks.peak_mem_bytes
    runs["stage3"][2].peaks = dataclasses.replace(runs["stage3"][2].peaks, peak_mem_bytes=int(peak0 / 3.5))
    passes(runs)


# -----------------------------------------------------------------------------
# (c)


def test_a_loss_that_rises_over_the_one_batch_at_both_stages_fails_c():
    runs = healthy()
    for rs in runs.values():
        every_rank(rs, lambda r: with_losses(r, s2=11.2))
    check = fails_alone(runs, "(c)", r"stage 0 11\.119 -> 11\.200 -> 7\.447; .*MISSED: stage 0 does not fall as it "
                                     r"should, stage 3 does not fall as it should$")
    assert check.figures.not_falling == ["stage 0", "stage 3"]


def a_later_step(r, loss):
    r.steps = [*r.steps, dataclasses.replace(r.steps[-1], step=4, loss=loss)]


def test_a_later_loss_back_at_the_first_steps_at_both_stages_fails_c():
    runs = healthy()
    for rs in runs.values():
        every_rank(rs, lambda r: a_later_step(r, r.steps[0].loss))
    check = fails_alone(runs, "(c)", r"stage 0 11\.119 -> 8\.205 -> 7\.447 -> 11\.119; .*MISSED: stage 0 does not "
                                     r"fall as it should, stage 3 does not fall as it should$")
    assert check.figures.not_falling == ["stage 0", "stage 3"]


def test_a_later_loss_below_the_first_steps_passes_c():
    runs = healthy()
    for rs in runs.values():
        every_rank(rs, lambda r: a_later_step(r, r.steps[0].loss * 0.999))
    passes(runs)


@pytest.mark.parametrize("apart, fails", [(0.0101, True), (0.0099, False)])
def test_stages_whose_losses_are_more_than_loss_rtol_apart_fail_c_and_e(apart, fails):
    runs = healthy()
    every_rank(runs["stage3"], lambda r: with_losses(r, s3=runs["stage0"][0].steps[2].loss * (1 + apart)))
    if fails:
        check = fails_alone(runs, "(c)", r"the stages agree to 1\.01% at every step \(at most 1%\).*MISSED: the "
                                         r"stages DIFFER by 1\.01%$", "(e)")
        assert check.figures.gap == pytest.approx(apart, rel=1e-3)
        assert "stage3 and stage0 DIFFER" in judged(runs)[0]["(e)"].detail
    else:
        passes(runs)


@pytest.mark.parametrize("apart, fails", [(1.01e-3, True), (0.99e-3, False)])
def test_stages_whose_weights_after_the_one_batch_are_apart_fail_c(apart, fails):
    runs = healthy()
    every_rank(runs["stage3"], lambda r: setattr(r, "trained_checksum", runs["stage0"][0].trained_checksum
                                                 * (1 + apart)))
    if fails:
        check = fails_alone(runs, "(c)", r"their weights after step 3 to 0\.101% \(at most 0\.1%\).*MISSED: the "
                                         r"weights DIFFER by 0\.101%$")
        assert check.figures.weights_apart == pytest.approx(apart, rel=1e-3)
    else:
        passes(runs)


@pytest.mark.parametrize("at_step_3, fails", [(8.0, True), (7.99, False)])
def test_the_1_3b_model_above_its_design_loss_at_step_3_at_both_stages_fails_c(at_step_3, fails):
    runs = healthy()
    for rs in runs.values():
        every_rank(rs, lambda r: with_losses(r, s3=at_step_3))
    if fails:
        check = fails_alone(runs, "(c)", r"MISSED: stage 0 is at 8\.000 at step 3, stage 3 is at 8\.000 at step 3$")
        assert check.figures.at_design_step == {"stage 0": 8.0, "stage 3": 8.0}
    else:
        passes(runs)


# -----------------------------------------------------------------------------
# (d) and (e): the stage-1 run that these add is judged by them alone, as the pair criteria set stages 0 and 3 side
# by side


def stage1(runs, edit):
    """runs with a stage-1 run beside them: stage 0's records as stage 1's, each edited."""
    rs = copy.deepcopy(runs["stage0"])
    every_rank(rs, lambda r: (setattr(r, "run", dataclasses.replace(r.run, stage=1)), edit(r)))
    return {**runs, "stage1": rs}


def test_a_run_that_did_not_finish_fails_d():
    runs = stage1(healthy(), lambda r: setattr(r, "error", "RuntimeError: planted"))
    check = fails_alone(runs, "(d)", r"stage0 100%/100%/100%, stage3 25%/25%/25%; FAILED: stage1 error$")
    assert check.figures.broken == ["stage1 error"]


def test_a_rank_that_holds_more_than_its_stage_promises_fails_d_and_its_shares_are_told():
    runs = healthy()
    held = runs["stage3"][2]  # what a rank that keeps its gradients whole writes of itself (finishing.add_shares)
    held.held_fraction, held.partition_check_ok = {**held.held_fraction, "grads": 1.0}, False
    check = fails_alone(runs, "(d)", r"stage3 25%/100%/25%; FAILED: stage3 not as promised$")
    assert check.figures.held["stage3"]["grads"] == 1.0


@pytest.mark.parametrize("apart, fails", [(2.01e-4, True), (1.99e-4, False)])
def test_a_first_loss_more_than_first_loss_rtol_from_the_references_fails_e(apart, fails):
    runs = healthy()
    every_rank(runs["stage3"], lambda r: with_losses(r, s1=runs["stage0"][0].steps[0].loss * (1 + apart)))
    if fails:
        check = fails_alone(runs, "(e)", r"stage3 0\.020% at step 1 and 0\.02% at most from stage0; MISSED: stage3 and "
                                         r"stage0 DIFFER$")
        assert check.figures.compared[0].step1_gap == pytest.approx(apart, rel=1e-3)
    else:
        passes(runs)


def test_a_run_whose_later_loss_is_more_than_loss_rtol_from_the_references_fails_e():
    runs = stage1(healthy(), lambda r: with_losses(r, s3=r.steps[2].loss * 1.0101))
    check = fails_alone(runs, "(e)", r"stage1 0\.000% at step 1 and 1\.01% at most from stage0; MISSED: stage1 and "
                                     r"stage0 DIFFER$")
    assert [c.same for c in check.figures.compared] == [True, False]


# -----------------------------------------------------------------------------
# the list of clauses


def clauses(judge):
    """The clauses of a criterion's judging function: its docstring's first paragraph, split at its semicolons."""
    said = " ".join(inspect.getdoc(judge).split("\n\n")[0].split())
    return [re.sub(r"^and ", "", part.strip()).rstrip(".") for part in said.split(";")]


def listed():
    """{criterion's name: {clause: (test, also)}} of docs/verdict-clauses.md's tables, under each criterion's
    heading."""
    found, name = {}, None
    for line in CLAUSES.read_text().splitlines():
        if line.startswith("## "):
            name = line[3:]
        elif name and line.startswith("| ") and not line.startswith(("| clause", "|---")):
            clause, test, also = [cell.strip() for cell in line.strip("|").split("|")]
            found.setdefault(name, {})[clause] = (test.strip("`"), also)
    return found


def test_the_clauses_page_lists_every_clause_of_each_criterion_and_no_other():
    on_page = listed()
    assert list(on_page) == [c.name for c in verdict.CRITERIA]
    for c in verdict.CRITERIA:
        assert list(on_page[c.name]) == clauses(c.judge), c.name


def test_each_clause_is_failed_by_a_test_of_this_file():
    tests = {name for name, f in globals().items() if name.startswith("test_") and callable(f)}
    named = {test for rows in listed().values() for test, _ in rows.values()}
    assert named <= tests, named - tests

