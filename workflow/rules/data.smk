# Raw data -> manifests -> client splits -> decode-once image caches and frozen-encoder feature caches.


localrules:
    download,


rule download:
    """Fetch and verify one dataset's raw files (local: compute nodes often have no internet)."""
    output:
        marker=f"{RAW}/{{dataset}}/.complete",
    log:
        "logs/download/{dataset}.log",
    conda:
        ENV
    shell:
        "fedrepro download {wildcards.dataset} --raw-dir {RAW} 2> {log}"


def prepare_inputs(wildcards):
    spec = registry.get(wildcards.dataset)
    return [raw_marker(wildcards.dataset)] + [f"resources/manifests/{d}.csv" for d in spec.depends_on]


rule prepare:
    """Raw layout -> canonical manifest; every image is decoded once (corrupt ones stop or are listed)."""
    input:
        prepare_inputs,
    output:
        manifest="resources/manifests/{dataset}.csv",
        skipped="resources/manifests/{dataset}.skipped.csv",
    params:
        corrupt=PROJECT.config["data"]["corrupt_images"],
    threads: 4
    resources:
        mem_mb=per_attempt(4000),
        runtime=per_attempt(60),
    log:
        "logs/prepare/{dataset}.log",
    conda:
        ENV
    shell:
        "fedrepro prepare {wildcards.dataset} --raw-dir {RAW} --out {output.manifest} "
        "--corrupt {params.corrupt} --workers {threads} 2> {log}"


rule split:
    """Manifest + partition spec + split seed -> client index file, count table and picture."""
    input:
        manifest=lambda wc: f"resources/manifests/{SPLITS[wc.split]['dataset']}.csv",
    output:
        split="resources/splits/{split}.json",
        counts="resources/splits/{split}.counts.csv",
        figure="resources/splits/{split}.png",
    params:
        dataset=lambda wc: SPLITS[wc.split]["dataset"],
        spec=lambda wc: json.dumps(SPLITS[wc.split]["spec"], sort_keys=True),
        seed=lambda wc: SPLITS[wc.split]["seed"],
    group:
        "splits"
    resources:
        mem_mb=per_attempt(2000),
        runtime=per_attempt(10),
    log:
        "logs/split/{split}.log",
    conda:
        ENV
    shell:
        "fedrepro split --dataset {params.dataset} --manifest {input.manifest} --spec {params.spec:q} "
        "--seed {params.seed} --out {output.split} 2> {log}"


rule features:
    """Encode every image of a dataset once with a frozen encoder (GPU job on a cluster)."""
    input:
        manifest="resources/manifests/{dataset}.csv",
        raw=lambda wc: raw_marker(wc.dataset),
    output:
        features="resources/features/{dataset}/{key}.pt",
    params:
        encoder=lambda wc: json.dumps(FEATURES[f"{wc.dataset}/{wc.key}"], sort_keys=True),
        device=PROJECT.config["device"],
        draft=str(PROJECT.config["data"]["jpeg_draft"]).lower(),
    threads: 8
    resources:
        gpu=1,
        mem_mb=per_attempt(16000),
        runtime=per_attempt(120),
    log:
        "logs/features/{dataset}/{key}.log",
    conda:
        ENV
    shell:
        "export CUBLAS_WORKSPACE_CONFIG=:4096:8 FEDREPRO_CPUS={threads}; "
        "fedrepro features --dataset {wildcards.dataset} --manifest {input.manifest} --raw-dir {RAW} "
        "--encoder {params.encoder:q} --device {params.device} --workers auto --jpeg-draft {params.draft} "
        "--out {output.features} 2> {log}"


rule image_cache:
    """Decode every image of a dataset once, at the size a training pipeline first resizes it to
    (docs/ARCHITECTURE.md, "Decode once"): image runs read these files instead of the originals."""
    input:
        manifest="resources/manifests/{dataset}.csv",
        raw=lambda wc: raw_marker(wc.dataset),
    output:
        pixels="resources/images/{dataset}/{spec}.u8",
        index="resources/images/{dataset}/{spec}.index.npz",
    wildcard_constraints:
        spec=r"(shorter|longer|square)\d+-[a-z]+(-full)?|original",
    threads: 8
    resources:
        mem_mb=per_attempt(8000),
        runtime=per_attempt(240),
    log:
        "logs/image_cache/{dataset}/{spec}.log",
    conda:
        ENV
    shell:
        "fedrepro image-cache --manifest {input.manifest} --raw-dir {RAW} --spec {wildcards.spec} "
        "--workers {threads} --out {output.pixels} 2> {log}"
