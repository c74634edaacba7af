# fedrepro: the whole pipeline as one DAG.
#
#   download -> prepare -> split -> image cache / features (frozen encoders) -> train (protocol x paper
#   x setting x method x seed) -> tables / figures (embeddings of trained models where a figure needs
#   them) -> scorecards
#
# Users: `snakemake --profile slurm all` (cluster), `snakemake --cores 2 all` (one machine),
# `snakemake --cores 2 results/tables/clean/<paper>/<table>.md` (one table, and only what it needs),
# `snakemake --cores 2 all_weights` (the pretrained weights only, on a machine with internet).
# The configuration is validated before any job is scheduled.


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/downstream.smk"
include: "workflow/rules/report.smk"


from fedrepro import targets


rule all:
    default_target: True
    input:
        all_outputs,


rule all_weights:
    """Every pretrained-weights resource the configuration loads, and nothing else (weights jobs only)."""
    input:
        JOBS.all_weights,


rule misplaced_target:
    """A target under another configuration's results folder (results/tables/... where this one writes to
    results/demo/): one line naming the folder this configuration writes to (fedrepro.targets), no job."""
    output:
        "{misplaced}",
    wildcard_constraints:
        misplaced=targets.misplaced_pattern(),
    input:
        lambda wildcards: targets.refuse_misplaced(wildcards.misplaced, workflow.overwrite_configfiles),
