"""FSDP2 as ZeRO-3's peer: the same model, data and recipe through PyTorch's fully_shard, in the same run,
the same table and the same records, with its sharding read from the DTensor shards."""
import json

import pytest

import report
from zero3bench import parts
from zero3bench.reporting import losses, reading, verdict
from conftest import ROOT, planted, run


def test_run_sh_runs_fsdp2_after_stage_3_and_keeps_its_log(fsdp2_peer):
    assert fsdp2_peer.proc.returncode == report.EXIT["NOT OBSERVABLE"], fsdp2_peer.proc.stdout[-3000:]
    assert list(fsdp2_peer.runs) == ["fsdp2", "stage3"]
    assert [r["engine"] for r in fsdp2_peer.runs["fsdp2"]] == ["fsdp2", "fsdp2"]
    assert "train_gpt.py --stage 3 --engine fsdp2" in (fsdp2_peer.folder / "fsdp2.log").read_text()


def test_fsdp2_shards_every_parameter_tensor_as_dtensor_chunks(fsdp2_peer):
    for r in fsdp2_peer.runs["fsdp2"]:
        assert r["partitioned_tensors"] == r["param_tensors"] > 0
        assert r["shard_check_ok"] and r["persistent_tensors"] == 0
        assert r["local_param_elems"] < r["params_total"] / 2 * 1.01
    assert sum(r["local_param_elems"] for r in fsdp2_peer.runs["fsdp2"]) == fsdp2_peer.runs["fsdp2"][0]["params_total"]


def test_fsdp2_shards_hold_the_same_initial_weights_as_stage_3(fsdp2_peer):
    zero3, peer = fsdp2_peer.runs["stage3"][0], fsdp2_peer.runs["fsdp2"][0]
    assert peer["weights_checksum"] == pytest.approx(zero3["weights_checksum"], rel=1e-9)


def test_fsdp2_trains_like_stage_3_at_every_step(fsdp2_peer):
    zero3, peer = fsdp2_peer.runs["stage3"][0]["losses"], fsdp2_peer.runs["fsdp2"][0]["losses"]
    assert peer == pytest.approx(zero3, rel=verdict.LOSS_RTOL)
    assert losses.loss_falls(peer)


def test_fsdp2_holds_16_bytes_per_parameter_over_the_ranks_as_fp32_weights_grads_and_moments(fsdp2_peer):
    for r in fsdp2_peer.runs["fsdp2"]:
        held = parts.Census.from_dict(r["model_state_breakdown"])
        assert held.params == held.grads == 4 * r["local_param_elems"]  # fp32 shards of both
        assert held.master == 0  # the weights are the optimizer's own
        assert r["model_state_bytes"] == pytest.approx(r["predicted_model_state_bytes"], rel=0.01)
        assert r["partition_check_ok"] and r["gathered_tensors"] == 0


def test_the_report_compares_stage_3_with_fsdp2(fsdp2_peer):
    out = fsdp2_peer.proc.stdout
    assert any(line.split() == ["fsdp2", "stage3", "stage3", "against", "fsdp2"] for line in out.splitlines())
    assert "stage 3 against fsdp2: speed not compared (CPU processes)" in out and "the losses agree to" in out
    record = json.loads((fsdp2_peer.folder / "summary.json").read_text())
    assert set(record["results"]) == {"fsdp2", "stage3"}
    assert (fsdp2_peer.folder / "memory.png").stat().st_size > 0


def test_a_peer_that_trains_another_model_fails_the_verdict(fsdp2_peer, tmp_path, capsys):
    def diverge(r):
        return {**r, "losses": [r["losses"][0], *(x * 0.95 for x in r["losses"][1:])]}
    assert report.main([str(planted(fsdp2_peer.folder, tmp_path, "fsdp2", diverge))]) == 1
    out = capsys.readouterr().out
    assert "the losses DIFFER, by 0.000% at step 1 and up to 5.00%" in out and "fsdp2 and stage3 DIFFER" in out


def test_a_peer_whose_loss_turns_nan_fails_the_verdict(fsdp2_peer, tmp_path, capsys):
    def nan_after_step_1(r):
        return {**r, "losses": [r["losses"][0], *(float("nan") for _ in r["losses"][1:])]}
    assert report.main([str(planted(fsdp2_peer.folder, tmp_path, "fsdp2", nan_after_step_1))]) == 1
    assert "fsdp2 and stage3 DIFFER" in capsys.readouterr().out


def test_fsdp2_is_not_paired_with_stage_0_in_the_verdict(fsdp2_peer):
    runs = reading.load_runs(fsdp2_peer.folder)
    assert reading.pairs(runs) == {2: ([], runs["stage3"])}


@pytest.mark.parametrize("args, message", [
    (["--stage", "0", "--engine", "fsdp2"], "--engine fsdp2 is ZeRO-3's peer and reads a stage-3 config, not stage 0"),
    (["--config", "configs/ds_config_stage3_offload.json", "--engine", "fsdp2"], "trains with torch's AdamW on the device"),
    (["--engine", "fsdp3"], "invalid choice: 'fsdp3'"),
])
def test_train_gpt_refuses_fsdp2_where_it_cannot_stand_beside_zero3(args, message):
    proc = run(["python3", "train_gpt.py", *args, "--check", "2"])
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_run_sh_refuses_an_unknown_peer_in_one_line():
    proc = run(["bash", "run.sh", "--peer", "ddp"])
    assert proc.returncode == 2
    assert proc.stderr.strip() == "run.sh: error: --peer takes fsdp2, not 'ddp'"
    assert not (ROOT / "results").exists() or proc.stdout == ""


@pytest.mark.parametrize("section, named", [({"scheduler": {"type": "WarmupLR"}}, "a scheduler"),
                                            ({"compile": {"deepcompile": True}}, "DeepCompile")])
def test_train_gpt_refuses_fsdp2_with_a_config_section_it_would_ignore(section, named, tmp_path):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({**json.loads((ROOT / "ds_config_stage3.json").read_text()), **section}))
    proc = run(["python3", "train_gpt.py", "--config", str(config), "--engine", "fsdp2", "--check", "2"])
    assert proc.returncode == 2 and f"has {named}" in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_summary_md_sets_stage_3_against_fsdp2(fsdp2_peer):
    assert "stage 3 against fsdp2: " in (fsdp2_peer.folder / "summary.md").read_text()
