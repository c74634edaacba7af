# Tables, figures and scorecards: they read only small per-run files (and what the embed rule
# extracted from trained models), each declared by its kind, so they rebuild from `dvc pull`ed files.
# The report (`snakemake --cores 1 report`) is one page of whatever of them exists. The input function of a
# table, figure, scorecard and the evidence page (JOBS.report_inputs) decides whether it is out of date in a way
# Snakemake does not see and records that in its out-of-date mark, one of its inputs: the one file planning writes
# (fedrepro.dag.out_of_date says why it cannot wait for a job).


localrules:
    table,
    figure,
    scorecard,
    evidence,
    report,


rule embed:
    """Extract once what a figure needs from a trained model (features for t-SNE, prototype patches)."""
    input:
        unpack(lambda wc: ancient_model(by_content(JOBS.embed_inputs(wc)))),
    output:
        embedding=paths.embedding(RunKey("{paper}", "{protocol}", "{setting}", "{method}", "{seed}"), "{figure}"),
    params:
        job=lambda wc: json.dumps(JOBS.embed_job(wc), sort_keys=True),
    resources:
        # a CPU job: no GPU's throughput table gives its rate, so this stays an unmeasured guess (fedrepro.cost.runtime)
        runtime=per_attempt(FALLBACK_RUNTIME["embed"]),
    log:
        paths.log("embed", "{protocol}/{paper}/{setting}/{method}/seed{seed}/{figure}"),
    conda:
        ENV
    shell:
        "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1; "
        "fedrepro --log {log} embed --job {params.job:q} --out {output.embedding}"


rule table:
    """One paper table as CSV, Markdown and LaTeX, with the published values beside ours."""
    input:
        JOBS.table_inputs,
    output:
        **table_outputs("{protocol}", "{paper}", "{table}"),     # md, csv, tex, seeds
    params:
        definition=JOBS.table_definition,
        config=JOBS.configuration,
        configfiles=JOBS.configfiles,
    log:
        paths.log("tables", "{protocol}/{paper}/{table}"),
    conda:
        ENV
    shell:
        "fedrepro --log {log} table --config-json {params.config:q} --configfiles {params.configfiles} "
        "--protocol {wildcards.protocol} --paper {wildcards.paper} --table {wildcards.table} --out {output.md}"


rule figure:
    input:
        JOBS.figure_inputs,
    output:
        **figure_outputs("{protocol}", "{paper}", "{figure}"),    # png, pdf
    params:
        definition=JOBS.figure_definition,
        config=JOBS.configuration,
        configfiles=JOBS.configfiles,
    log:
        paths.log("figures", "{protocol}/{paper}/{figure}"),
    conda:
        ENV
    shell:
        "fedrepro --log {log} figure --config-json {params.config:q} --configfiles {params.configfiles} "
        "--protocol {wildcards.protocol} --paper {wildcards.paper} --figure {wildcards.figure} --out {output.png}"


rule scorecard:
    """Did each published number reproduce? Every published cell of a paper's tables (or of all papers)
    under every configured protocol: our mean, its 95% interval, the difference and a verdict."""
    input:
        JOBS.scorecard_inputs,
    output:
        **scorecard_outputs("{paper}"),     # html, md, csv, png, pdf
    params:
        definition=JOBS.scorecard_definition,
        config=JOBS.configuration,
        configfiles=JOBS.configfiles,
    log:
        paths.log("scorecards", "{paper}"),
    conda:
        ENV
    shell:
        "fedrepro --log {log} scorecard --config-json {params.config:q} --configfiles {params.configfiles} "
        "--paper {wildcards.paper} --out {output.html}"


rule evidence:
    """Did every run clear the configuration's learning bar (config `evidence`, the demo's)? A page with
    every run's score, one learning-curve figure per paper, and bar.csv."""
    input:
        JOBS.evidence_inputs,
    output:
        html=paths.evidence(),
        md=paths.evidence("index.md"),
        csv=paths.evidence("bar.csv"),
    params:
        definition=JOBS.evidence_definition,
        config=JOBS.configuration,
        configfiles=JOBS.configfiles,
    log:
        paths.log("evidence", "index"),
    conda:
        ENV
    shell:
        "fedrepro --log {log} evidence --config-json {params.config:q} --configfiles {params.configfiles} --out {output.html}"


rule report:
    """One self-contained page of what this configuration has built (one table's worth or the whole grid): per
    paper what ran, whether the published numbers reproduced, whether every method learned, the tables and the
    figures; the rule graph last. Its inputs are the planned tables, figures, scorecards and run records that
    exist now, so Snakemake brings those up to date first and builds nothing that is not there. Not part of
    `all`: run it after (`snakemake --cores 1 report`)."""
    input:
        JOBS.overview_inputs,
    output:
        html=report(paths.report(), category="Report", caption="../report/report.rst"),
    params:
        definition=JOBS.report_definition,
        config=JOBS.configuration,
        configfiles=JOBS.configfiles,
    log:
        paths.log("report", "report"),
    conda:
        ENV
    shell:
        "fedrepro --log {log} report --config-json {params.config:q} --configfiles {params.configfiles} --out {output.html}"
