"""Issue 25, case 8: what a killed job leaves (half-written temporaries) is removed when it starts again; a job's
log keeps every attempt, each under a header; the docs show paths the rules make and how to pass a config file
before a target."""

from __future__ import annotations

import os
import re
from pathlib import Path

from infra_support import REPO


def test_a_restarted_job_removes_the_temporaries_of_the_killed_attempt(tiny):
    from fedrepro.cli import main
    from fedrepro.train import train_run

    left = [Path("ckpt/.model.pt.k1ll3d.tmp"), Path("ckpt/.resume.pt.x7y8z9.tmp"), Path("out/.metrics.json.ab12cd.tmp")]
    for path in left:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half")
    train_run(tiny, "out", "ckpt")
    assert not [p for p in left if p.exists()] and Path("out/metrics.json").exists()

    pixels = Path("resources/images/demo_bt/square16-bilinear.u8")
    other = pixels.with_name(".square32-bilinear.u8.zz99.tmp")              # another job's: left alone
    for path in (pixels.with_name(".square16-bilinear.u8.q1w2.tmp"), pixels.with_name(".square16-bilinear.index.npz.e3.tmp"), other):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half")
    main(["image-cache", "--manifest", tiny["paths"]["manifest"], "--raw-dir", tiny["paths"]["raw_dir"],
          "--spec", "square16-bilinear", "--out", str(pixels)])
    assert sorted(p.name for p in pixels.parent.iterdir()) == sorted([pixels.name, "square16-bilinear.index.npz",
                                                                        "square16-bilinear.u8.provenance", other.name])


def attempt(log: Path, text: str, killed: bool) -> None:
    """One attempt of a job, in a child process as Snakemake runs it: stderr goes to the log through `--log`."""
    pid = os.fork()
    if pid == 0:
        try:
            from fedrepro.cli import attach_log, attempt_header

            attach_log(log)
            attempt_header("train")
            os.write(2, text.encode())
        finally:
            os._exit(137 if killed else 0)
    os.waitpid(pid, 0)


def test_a_job_log_keeps_every_attempt_under_its_header(tmp_path):
    log = tmp_path / "logs/train/run.log"
    attempt(log, "round 1 of 3\n", killed=True)
    log.unlink()                                    # Snakemake deletes a job's log before each attempt
    attempt(log, "round 3 of 3\n", killed=False)
    text = log.read_text()
    assert len(re.findall(r"==== fedrepro train: attempt started .* \(pid \d+\) ====", text)) == 2
    assert text.index("round 1 of 3") < text.rindex("attempt started") < text.index("round 3 of 3")
    rules = "".join(path.read_text() for path in (REPO / "workflow/rules").glob("*.smk"))
    commands = re.findall(r'"fedrepro [^"]*', rules)            # every job's command logs that way
    assert len(commands) >= 13 and all(c.startswith('"fedrepro --log {log} ') for c in commands)
    assert "2> {log}" not in rules


def test_the_docs_show_the_paths_the_rules_make_and_the_config_file_form_that_takes_a_target():
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "workflow/profiles/slurm/config.yaml"]
    for doc in docs:
        text = doc.read_text()
        assert not re.search(r"results/(tables|figures)/<paper>", text), doc      # no rule makes these
        assert not re.search(r"snakemake[^\n`]* --configfile [^\s=`]+\.yaml (all|results/)", text), doc   # reads the target as a config
    readme = (REPO / "README.md").read_text()
    assert "results/tables/<protocol>/<paper>/…" in readme and "results/figures/<protocol>/<paper>/…" in readme
    assert "--configfile=config/demo.yaml" in readme and "second config file" in readme
