# One federated training job per (paper, setting, method, seed).


def train_inputs(wildcards):
    run = run_config(wildcards)
    inputs = {"manifest": run["paths"]["manifest"], "split": run["paths"]["split"]}
    if run["paths"]["features"]:
        inputs["features"] = run["paths"]["features"]
    elif run["paths"]["images"]:   # decode-once caches: the job never opens an original image
        for part, pixels in run["paths"]["images"].items():
            inputs[f"images_{part}"] = pixels
            inputs[f"images_{part}_index"] = pixels.removesuffix(".u8") + ".index.npz"
    else:
        inputs["raw"] = raw_marker(run["dataset"])
    return inputs


def on_features(wildcards) -> bool:
    """Runs on cached encoder features take seconds to minutes on a CPU; image runs want a GPU."""
    return run_config(wildcards)["input"] == "features"


def train_group(wildcards):
    # Feature-level runs are tiny: on a cluster they share one group, and the profile's
    # `group-components: train_features=N` packs N of them into one SLURM job.
    return "train_features" if on_features(wildcards) else None


rule train:
    """Run the rounds; checkpoint every round (a killed job resumes); write metrics and provenance."""
    input:
        unpack(train_inputs),
    output:
        metrics="results/runs/{paper}/{setting}/{method}/seed{seed}/metrics.json",
        history="results/runs/{paper}/{setting}/{method}/seed{seed}/history.csv",
        predictions="results/runs/{paper}/{setting}/{method}/seed{seed}/predictions.npz",
        manifest="results/runs/{paper}/{setting}/{method}/seed{seed}/run_manifest.json",
        model="results/checkpoints/{paper}/{setting}/{method}/seed{seed}/model.pt",
    params:
        run=lambda wc: json.dumps(run_config(wc), sort_keys=True),
        config_hash=lambda wc: run_config(wc)["config_hash"],
        checkpoint_dir="results/checkpoints/{paper}/{setting}/{method}/seed{seed}",
    group:
        train_group
    threads: lambda wc: 1 if on_features(wc) else 8   # image runs: one CPU trains, the rest decode and augment
    resources:
        gpu=lambda wc: 0 if on_features(wc) else 1,
        mem_mb=lambda wc, attempt: attempt * (4000 if on_features(wc) else 32000),
        runtime=lambda wc, attempt: attempt * (15 if on_features(wc) else 720),
    log:
        "logs/train/{paper}/{setting}/{method}/seed{seed}.log",
    conda:
        ENV
    shell:
        "export CUBLAS_WORKSPACE_CONFIG=:4096:8 FEDREPRO_CPUS={threads}; "
        "fedrepro train --run {params.run:q} --out $(dirname {output.metrics}) "
        "--checkpoint-dir {params.checkpoint_dir} 2> {log}"
