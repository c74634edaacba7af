"""Issue 41: a result proves what it was made from. Each case as a researcher's shared project space would meet it,
on the tiny grid's real inputs: every one ended in a wrong number, figure or run without a word before (the
docstring of each test says what happened), and now ends in a refusal that names the file, what it should have
been made from and the command that rebuilds it, or in a correct rebuild."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import pytest

from fedrepro import paths
from infra_support import TINY_CONFIG, run, with_rounds

from .test_stale_runs import TABLE, build_table


def trained(run: dict):
    from fedrepro.train import train_run

    from .support import tiny_project

    key = tiny_project().plan.runs()[0]
    train_run(run, paths.run_dir(key), paths.checkpoint_dir(key))
    return key


def refusal(caplog, build) -> str:
    caplog.set_level(logging.ERROR)
    with pytest.raises(SystemExit):
        build()
    return caplog.records[-1].getMessage()


def test_a_table_refuses_an_edited_metrics_json_and_one_its_predictions_contradict(tiny, caplog):
    """Before: one number added by hand to metrics.json went into the table (and the scorecard's verdict) without a
    word. The run manifest records metrics.json's digest; a forger who also rewrites that record is caught by the
    metrics computed again from predictions.npz."""
    from fedrepro.io import read_json, text_digest, with_content_digest, write_json

    key = trained(tiny)
    metrics_path, manifest_path = paths.run_file(key), paths.run_file(key, "run_manifest.json")
    original = read_json(metrics_path)
    edited = json.loads(json.dumps(original))
    edited["eval"]["global"]["acc"] = original["eval"]["global"]["acc"] + 0.1665
    write_json(metrics_path, edited)
    message = refusal(caplog, build_table)
    assert f"{TABLE}: 1 of the files it reads are not what made them" in message, message
    assert f"{metrics_path}: holds sha256:" in message and "the run wrote sha256:" in message
    assert f"snakemake {TABLE} --cores all --configfile={TINY_CONFIG} --forcerun {metrics_path}" in message
    assert not Path(TABLE).exists()

    manifest = read_json(manifest_path)
    manifest["outputs"]["metrics.json"] = text_digest(json.dumps(edited, indent=2, sort_keys=True) + "\n")
    write_json(manifest_path, with_content_digest(manifest))               # the record rewritten to match
    message = refusal(caplog, build_table)
    assert f"{metrics_path}: says global acc {edited['eval']['global']['acc']:.6g}, its predictions" in message, message
    assert f"give {original['eval']['global']['acc']:.6g}" in message

    write_json(metrics_path, original)
    manifest["outputs"]["metrics.json"] = text_digest(json.dumps(original, indent=2, sort_keys=True) + "\n")
    write_json(manifest_path, with_content_digest(manifest))
    build_table()                                                          # as the run wrote it: built
    assert Path(TABLE).exists()


def test_a_table_refuses_a_run_of_another_configuration_in_its_cell(tiny, caplog):
    """Before: a second configuration (3 rounds) wrote the run's folder, and with `--rerun-triggers mtime` the table of
    the first (2 rounds) read it: two configurations in one cell, exit 0."""
    key = trained(with_rounds(tiny, 3))
    message = refusal(caplog, build_table)
    assert (f"{paths.run_dir(key)}: made by another configuration (config hash {with_rounds(tiny, 3)['config_hash']}; "
            f"this configuration makes the run with {tiny['config_hash']})") in message, message
    assert f"--forcerun {paths.run_file(key)}" in message


def test_a_run_refuses_a_split_of_another_seed_copied_over_its_own(tiny):
    """Before: seed 1's split copied over seed 0's trained seed 0 on seed 1's clients; its run manifest said split
    seed 1, and the table's mean moved."""
    from fedrepro.cli import main
    from fedrepro.io import StaleInput
    from fedrepro.train import train_run

    split = tiny["paths"]["split"]
    spec = json.loads(Path(split).read_text())["spec"]
    main(["split", "--dataset", tiny["dataset"], "--manifest", tiny["paths"]["manifest"], "--spec", json.dumps(spec),
          "--seed", "1", "--out", "seed1.json"])
    for copy_record in (False, True):
        shutil.copy2("seed1.json", split)
        if copy_record:                                   # the record copied along: the split still names itself
            shutil.copy2(paths.provenance("seed1.json"), paths.provenance(split))
        with pytest.raises(StaleInput) as error:
            train_run(tiny, "out", "ckpt")
        message = str(error.value)
        assert f"{split} holds the split {tiny['dataset']}-iid-c2-s1-" in message and "split seed 1" in message, message
        assert f"not this run's {tiny['split_id']}" in message and f"snakemake --cores all --forcerun {split}" in message
        assert not Path("out/metrics.json").exists()


def test_an_embedding_job_refuses_another_runs_model(tiny):
    """Before: FedAvg's model.pt copied into FedIIC's checkpoint folder drew FedIIC's t-SNE from FedAvg's model
    (the downstream job compared the config hash, the embed job did not). Here: another configuration's model, then
    one of this configuration that is not the file the run wrote; through the loader every extractor calls."""
    from fedrepro.embed import _checkpoint
    from fedrepro.io import StaleInput, torch_load, torch_save

    key = trained(tiny)
    model = paths.model_file(key)
    job = {"run": tiny, "figure": {"name": "tsne", "kind": "tsne"}, "checkpoint": model}
    assert "server" in _checkpoint(job)                                  # its own model: read
    saved = torch_load(model)
    torch_save(model, {**saved, "config_hash": with_rounds(tiny, 3)["config_hash"]})
    with pytest.raises(StaleInput, match=rf"{model} was trained by another configuration \(config hash "
                                         rf"{with_rounds(tiny, 3)['config_hash']}, run foundation/bt_iid/fedclip seed 0 "
                                         rf"is {tiny['config_hash']}\)"):
        _checkpoint(job)
    server = saved["model"]["server"]
    name = next(k for k, v in server.items() if v.is_floating_point())
    torch_save(model, {**saved, "model": {**saved["model"], "server": {**server, name: server[name] + 1.0}}})
    with pytest.raises(StaleInput, match=rf"{model} is not the model its run wrote \({paths.run_file(key, 'run_manifest.json')} "
                                         rf"records crc32:.*scripts/dvc-results.py pull --stages checkpoints"):
        _checkpoint(job)


def test_a_scorecard_refuses_a_table_cut_off_mid_number_and_the_table_is_out_of_date(tiny, caplog):
    """Before: a table's CSV cut off mid-number left the table "Nothing to be done" and the scorecard was built from
    the cut file (4 rows -> 1 or 2). The table's record says what its job wrote: the scorecard refuses the cut file,
    and while Snakemake plans, the table counts as out of date (so `snakemake all` makes it again first)."""
    from fedrepro.cli import main
    from fedrepro.report.consistency import out_of_date

    from .support import tiny_config_json, tiny_project

    trained(tiny)
    build_table()
    scorecard = paths.scorecard("foundation")

    def build_scorecard():
        main(["scorecard", "--config-json", tiny_config_json(), "--configfiles", TINY_CONFIG, "--paper", "foundation",
              "--out", scorecard])

    build_scorecard()
    assert Path(scorecard).exists() and Path(paths.provenance(scorecard)).exists()
    csv = Path(paths.table("clean", "foundation", "accuracy", ".csv"))
    text = csv.read_text()
    csv.write_text(text[: text.index(".") + 2])                          # mid-number
    message = refusal(caplog, build_scorecard)
    assert f"{scorecard}: 1 of the reports it reads changed since they were made" in message, message
    assert f"{csv} (holds sha256:" in message and f"not what {paths.provenance(TABLE)} says its job wrote" in message
    assert f"snakemake {scorecard} --cores all --configfile={TINY_CONFIG} --forcerun {TABLE}" in message
    reasons = out_of_date(tiny_project(), TABLE, [])
    assert reasons == [f"{csv} is not what its job wrote"], reasons


def test_outputs_follow_the_umask(tiny, monkeypatch):
    """Before: every output was 0600 (mkstemp), so colleagues on a shared project space could read no table, run
    or report."""
    from fedrepro import io

    key = trained(tiny)
    wanted = 0o666 & ~io.umask()
    assert wanted & 0o044, "a umask that hides files from the group and others would not show the difference"
    for path in (paths.run_file(key), paths.run_file(key, "predictions.npz"), paths.model_file(key), tiny["paths"]["split"],
                 tiny["paths"]["features"], paths.provenance(tiny["paths"]["features"])):
        assert os.stat(path).st_mode & 0o777 == wanted, (path, oct(os.stat(path).st_mode))
    monkeypatch.setattr(io, "_UMASK", [0o002])                            # a group-writable project space
    io.write_text("shared.txt", "x")
    assert os.stat("shared.txt").st_mode & 0o777 == 0o664


@pytest.mark.slow
def test_content_not_clocks_decides_what_reruns_and_one_folder_holds_one_configuration(tiny, tmp_path):
    """The real workflow, one run trained by Snakemake (so its job records the checksums of its inputs), then:
    - a feature cache rebuilt with the same bytes and a split and manifest dated 2 h ahead (clock skew between the
      nodes of a shared filesystem) rerun nothing, and the skewed files are named. Before: 49 jobs planned for a
      same-bytes cache; a skewed cache's training job ran, was failed by Snakemake as clock skew and its five good
      outputs deleted, twice in a row;
    - a feature cache rebuilt in the same invocation still reruns what reads it;
    - a table CSV cut off mid-number is made again (before: "Nothing to be done");
    - a hyper-parameter edited in the configuration's own paper file reruns its run; another configuration file
      that would overwrite the run is refused before any job, naming the owner and the ways out (before: it
      overwrote the run without a word), and with `--config force_results_dir=results` plans the takeover."""
    from fedrepro.cli import main

    from .support import job_counts, tiny_project, workflow_here

    snakemake, env = workflow_here(tmp_path / "home")
    key = tiny_project().plan.runs()[0]
    table, features, split = TABLE, tiny["paths"]["features"], tiny["paths"]["split"]

    def plan(*words: str, config: list[str] = snakemake, check: bool = True):
        proc = run([*config, *words, "--dry-run"], Path.cwd(), env, check=check)
        return job_counts(proc.stdout + proc.stderr), proc.stdout + proc.stderr

    run([*snakemake, table], Path.cwd(), env)
    outputs = [paths.run_file(key, name) for name in paths.RUN_FILES] + [paths.model_file(key)]
    assert all(Path(f).exists() for f in outputs)
    made = {f: Path(f).read_bytes() for f in outputs}

    before = Path(features).stat().st_mtime_ns
    main(["features", "--dataset", tiny["dataset"], "--manifest", tiny["paths"]["manifest"], "--raw-dir",
          tiny["paths"]["raw_dir"], "--encoder", json.dumps(tiny["features"]["encoder"]), "--device", "cpu",
          "--out", features])
    assert Path(features).stat().st_mtime_ns > before                       # the same bytes, written again
    ahead = time.time() + 2 * 3600
    for skewed in (split, paths.provenance(split), tiny["paths"]["manifest"]):
        os.utime(skewed, (ahead, ahead))
    done = run([*snakemake, table], Path.cwd(), env)                        # not a dry run: nothing deleted
    assert job_counts(done.stdout + done.stderr) == {}, (done.stdout + done.stderr)[-3000:]
    assert f"fedrepro: {split} is dated 2.0 h in the future" in done.stderr
    assert {f: Path(f).read_bytes() for f in outputs} == made

    jobs, _ = plan(table, "--forcerun", features)
    assert jobs == {"features": 1, "train": 1, "table": 1}, jobs

    csv = Path(paths.table("clean", "foundation", "accuracy", ".csv"))
    csv.write_text(csv.read_text()[:-4])                                    # cut off mid-number
    jobs, said = plan(table)
    assert jobs == {"table": 1} and f"{csv} is not what its job wrote" in said, said[-3000:]

    paper = Path(TINY_CONFIG).with_name("foundation.yaml")
    paper.write_text(paper.read_text().replace("rounds: 2", "rounds: 3"))    # the owner edits a hyper-parameter
    jobs, _ = plan(table)
    assert jobs.get("train") == 1, jobs
    paper.write_text(paper.read_text().replace("rounds: 3", "rounds: 2"))
    other = Path(TINY_CONFIG).with_name("other.yaml")
    other.write_text(Path(TINY_CONFIG).read_text().replace("threads: 1", "threads: 2"))   # another configuration
    theirs = [*snakemake[:-1], f"--configfile={other}"]
    _, said = plan(table, config=theirs, check=False)
    assert (f"results holds the results of {TINY_CONFIG} (results/.fedrepro-owner); this configuration ({other}) "
            f"would train 1 of its runs again over them") in said, said[-3000:]
    assert "results_dir: <folder>" in said and "--config force_results_dir=results" in said
    jobs, said = plan(table, "--config", "force_results_dir=results", config=theirs)
    assert jobs.get("train") == 1 and f"fedrepro: taking results over from {TINY_CONFIG}" in said, said[-3000:]
