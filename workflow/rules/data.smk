# Raw data -> manifests -> client splits -> decode-once image caches and frozen-encoder feature caches;
# pretrained weights fetched once.


localrules:
    download,
    weights,


rule download:
    """Fetch and verify one dataset's raw files (local: compute nodes often have no internet); a folder dataset
    (your own images and labels CSV) is checked and linked in."""
    input:
        JOBS.download_inputs,
    output:
        marker=paths.raw_marker("{dataset}", RAW),
    params:
        raw=lambda wc, output: JOBS.raw_root(output.marker),
    log:
        paths.log("download", "{dataset}"),
    conda:
        ENV
    shell:
        "fedrepro --log {log} download {wildcards.dataset} --raw-dir {params.raw}"


rule weights:
    """Fetch one pretrained-weights resource (open_clip tag, timm hub weights, Hugging Face repository)
    once and record every file's SHA-256 (local: compute nodes often have no internet; jobs load the
    copy offline). The id says what it is, e.g. open_clip--ViT-B-16--openai (fedrepro.models.weights)."""
    output:
        manifest=paths.weights_manifest("{weights}"),
    log:
        paths.log("weights", "{weights}"),
    conda:
        ENV
    shell:
        "fedrepro --log {log} weights {wildcards.weights}"


rule prepare:
    """Raw layout -> canonical manifest; every image is decoded once (corrupt ones stop or are listed)."""
    input:
        JOBS.prepare_inputs,
    output:
        manifest=paths.manifest("{dataset}"),
        skipped=paths.manifest_skipped("{dataset}"),
        provenance=paths.provenance(paths.manifest("{dataset}")),
    params:
        raw=lambda wc, input: JOBS.raw_root(input[0]),
        corrupt=PROJECT.config["data"]["corrupt_images"],
    threads: min(4, PROJECT.config["cache_threads"])
    resources:
        mem_mb=per_attempt(4000),
        runtime=per_attempt(60),
    log:
        paths.log("prepare", "{dataset}"),
    conda:
        ENV
    shell:
        "fedrepro --log {log} prepare {wildcards.dataset} --raw-dir {params.raw} --out {output.manifest} "
        "--corrupt {params.corrupt} --workers {threads}"


rule split:
    """Manifest + partition spec + split seed -> client index file, count table and picture."""
    input:
        unpack(lambda wc: by_content({"manifest": paths.manifest(JOBS.split_of(wc)["dataset"])})),
    output:
        split=paths.split("{split}"),
        counts=paths.split("{split}", ".counts.csv"),
        figure=paths.split("{split}", ".png"),
        provenance=paths.provenance(paths.split("{split}")),
    params:
        dataset=lambda wc: JOBS.split_of(wc)["dataset"],
        spec=lambda wc: json.dumps(JOBS.split_of(wc)["spec"], sort_keys=True),
        seed=lambda wc: JOBS.split_of(wc)["seed"],
    group:
        "splits"
    resources:
        mem_mb=per_attempt(2000),
        runtime=per_attempt(10),
    log:
        paths.log("split", "{split}"),
    conda:
        ENV
    shell:
        "fedrepro --log {log} split --dataset {params.dataset} --manifest {input.manifest} --spec {params.spec:q} "
        "--seed {params.seed} --out {output.split}"


rule image_cache:
    """Decode every image of a dataset once, at the size a training pipeline first resizes it to
    (docs/ARCHITECTURE.md, "Decode once"): image runs read these files instead of the originals."""
    input:
        unpack(lambda wc: by_content({"manifest": paths.manifest(wc.dataset), "raw": paths.raw_marker(wc.dataset, RAW)})),
    output:
        pixels=paths.image_cache("{dataset}", "{spec}"),
        index=paths.image_cache_index(paths.image_cache("{dataset}", "{spec}")),
        provenance=paths.provenance(paths.image_cache("{dataset}", "{spec}")),
    params:
        raw=lambda wc, input: JOBS.raw_root(input.raw),
    threads: PROJECT.config["cache_threads"]
    resources:
        mem_mb=per_attempt(8000),
        # the measured cache-building rate per process x the threads, with a margin (fedrepro.cost.runtime); 240 without
        # a table (a guess)
        runtime=lambda wc, attempt, threads: attempt * JOBS.requests.image_cache_request(wc, threads).runtime,
    log:
        paths.log("image_cache", "{dataset}/{spec}"),
    conda:
        ENV
    shell:
        "fedrepro --log {log} image-cache --manifest {input.manifest} --raw-dir {params.raw} --spec {wildcards.spec} "
        "--workers {threads} --out {output.pixels}"


rule features:
    """Encode every image of a dataset once with a frozen encoder (GPU job on a cluster)."""
    input:
        unpack(lambda wc: by_content({"manifest": paths.manifest(wc.dataset), "raw": paths.raw_marker(wc.dataset, RAW),
                                      "weights": JOBS.features_weights(wc)})),
    output:
        features=paths.features("{dataset}", "{key}"),
        provenance=paths.provenance(paths.features("{dataset}", "{key}")),
    params:
        raw=lambda wc, input: JOBS.raw_root(input.raw),
        encoder=lambda wc: json.dumps(JOBS.feature_job(wc)["encoder"], sort_keys=True),
        device=PROJECT.config["device"],
        draft=lambda wc: str(JOBS.feature_job(wc)["jpeg_draft"]).lower(),
        pixels=lambda wc: JOBS.feature_job(wc)["pixels"],
        class_texts=lambda wc: json.dumps(JOBS.class_texts(wc.dataset)),   # what the prompts say: a change reruns the job
    threads: PROJECT.config["cache_threads"]
    resources:
        gpu=1,
        mem_mb=per_attempt(16000),
        # one pass of the encoder over the dataset at its measured rate, decode-bound at the job's workers, with
        # a margin (fedrepro.cost.runtime); without a table 120 minutes and no GPU memory named (guesses)
        runtime=lambda wc, attempt, threads: attempt * JOBS.requests.features_request(wc, threads).runtime,
        gpu_mem_mb=lambda wc, threads: JOBS.requests.features_request(wc, threads).gpu_mem_mb,
    log:
        paths.log("features", "{dataset}/{key}"),
    conda:
        ENV
    shell:
        "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 FEDREPRO_CPUS={threads}; "
        "fedrepro --log {log} features --dataset {wildcards.dataset} --manifest {input.manifest} --raw-dir {params.raw} "
        "--encoder {params.encoder:q} --device {params.device} --workers auto --jpeg-draft {params.draft} "
        "--pixels {params.pixels} --out {output.features}"
