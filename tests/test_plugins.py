"""Plug-ins and extensions (docs/plugins.md): a method or dataset from outside the package is found by the registry
like a built-in one, joins the papers' tables as a twin of their baseline rows, and every bad input stops the
configuration before any job, naming the plug-in, file or key; nothing built in changes when an extension is added.

Plug-ins here are real distributions on ``sys.path`` (a dist-info folder with an ``entry_points.txt``, as ``pip``
writes it), found through ``importlib.metadata`` as installed ones are. The end-to-end run of the example package,
installed with ``pip install -e`` and run through Snakemake, is tests/test_plugin_example.py.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from fedrepro import paths, registry
from fedrepro.config import ConfigError, load_project

ROOT = Path(__file__).resolve().parents[1]
DEMO = [ROOT / "config/demo.yaml"]
PAPERS = {"papers": ["fediic", "facmic"]}       # two demo twins: fast to plan, both kinds of table

METHOD_MODULE = '''
from fedrepro.methods.fedavg import FedAvg
from fedrepro.registry import register_method


@register_method("{name}", params={{"beta": {{"type": "number", "minimum": 0, "maximum": 1, "default": 0.5}}}},
                 inputs={inputs})
class Mine(FedAvg):
    """A FedAvg with a parameter, standing for a researcher's method."""
'''


@pytest.fixture()
def plugins(monkeypatch, tmp_path):
    """A clean slate for plug-ins: the registries as built in, entry points looked up again, and every plug-in
    module, path and declaration a test adds gone afterwards."""
    for catalogue in registry.REGISTRIES:
        catalogue.load_builtin()
    saved = [(c, dict(c._entries)) for c in registry.REGISTRIES]
    state, imported, found = dict(registry._STATE), set(registry._IMPORTED), dict(registry._PLUGINS)
    modules = set(sys.modules)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for var in (registry.PLUGINS_ENV, registry.DATASETS_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(paths, "folder_check", lambda name: str(tmp_path / "checks" / f"{name}.json"))
    registry._STATE.update(entry_points=False, datasets=None)
    for catalogue, entries in saved:     # only built-ins: a plug-in another test left must not be seen
        catalogue._entries = {k: e for k, e in entries.items() if e.origin is None}
    yield tmp_path
    for catalogue, entries in saved:
        catalogue._entries = entries
    registry._STATE.clear()
    registry._STATE.update(state)
    registry._IMPORTED.clear()
    registry._IMPORTED.update(imported)
    registry._PLUGINS.clear()
    registry._PLUGINS.update(found)
    for name in set(sys.modules) - modules:     # the plug-ins a test made (not what torch imported meanwhile)
        where = getattr(sys.modules[name], "__file__", None)
        if where is None or Path(where).is_relative_to(tmp_path):
            del sys.modules[name]
    importlib.invalidate_caches()
    paths.use_results_dir("results")


def distribution(folder: Path, dist: str, module: str, source: str, entry: str | None = None) -> Path:
    """An installed distribution ``dist`` 0.1 whose entry point (group fedrepro.plugins) is ``module``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(textwrap.dedent(source))
    info = folder / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[fedrepro.plugins]\n{entry or module} = {module}\n")
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    return folder


def project(extra: dict | None = None, base: dict | None = None):
    return load_project(DEMO, overrides={**PAPERS, **(base or {}), **(extra or {})}, root=ROOT)


def extension(**methods) -> dict:
    return {"extension": {"name": "mine", "methods": methods}}


# ---- found like the built-ins --------------------------------------------------------------------

def test_an_installed_plugin_is_found_checked_and_counted(plugins, capsys):
    distribution(plugins / "site", "fedrepro-mine", "mine_plugin", METHOD_MODULE.format(name="mine", inputs=registry.INPUTS))
    entry = registry.METHODS.get("mine")
    assert entry.origin == "mine_plugin" and entry["schema"]["properties"]["beta"]["default"] == 0.5
    assert registry.METHODS.get("fedavg").origin is None
    from fedrepro.cli import main

    main(["validate", "--configfile", str(DEMO[0])])
    out = capsys.readouterr().out
    assert "plug-in mine_plugin (entry point mine_plugin = mine_plugin of fedrepro-mine 0.1): 1 method (mine)" in out


def test_a_module_named_in_the_configuration_is_loaded_and_a_misspelt_one_is_named(plugins):
    folder = plugins / "mods"
    folder.mkdir()
    (folder / "my_methods.py").write_text(METHOD_MODULE.format(name="mine2", inputs=registry.INPUTS))
    sys.path.insert(0, str(folder))
    project({"plugins": ["my_methods"]})
    assert registry.METHODS.get("mine2").origin == "my_methods"
    with pytest.raises(ConfigError, match=r"plug-in 'my_methodz' \(config: plugins\) failed to import: "
                                          r"ModuleNotFoundError.*correct the name"):
        project({"plugins": ["my_methodz"]})


def test_a_plugin_that_fails_to_import_is_named_with_its_distribution_and_line(plugins):
    distribution(plugins / "site", "fedrepro-broken", "broken_plugin", "import fedrepro\nraise RuntimeError('no GPU here')\n")
    with pytest.raises(ConfigError) as error:
        project()
    text = str(error.value)
    assert "plug-in 'broken_plugin' (entry point broken_plugin = broken_plugin of fedrepro-broken 0.1)" in text
    assert "RuntimeError: no GPU here" in text and "broken_plugin.py:2" in text
    assert "pip uninstall fedrepro-broken" in text


def test_a_name_that_clashes_with_a_builtin_is_refused_and_nothing_is_replaced(plugins):
    builtin = registry.METHODS._entries["fedavg"].obj      # (get() would look for plug-ins before the one below exists)
    distribution(plugins / "site", "fedrepro-clash", "clash_plugin", METHOD_MODULE.format(name="fedavg", inputs=registry.INPUTS))
    with pytest.raises(ConfigError, match=r"plug-in 'clash_plugin' \(entry point .* of fedrepro-clash 0.1\) registers the "
                                          r"method 'fedavg', which the built-in fedrepro.methods.fedavg already "
                                          r"registers; nothing is replaced"):
        project()
    assert registry.METHODS.get("fedavg").obj is builtin


def test_two_plugins_with_one_name_are_both_named(plugins):
    distribution(plugins / "a", "fedrepro-a", "plugin_a", METHOD_MODULE.format(name="twice", inputs=registry.INPUTS))
    distribution(plugins / "b", "fedrepro-b", "plugin_b", METHOD_MODULE.format(name="twice", inputs=registry.INPUTS))
    with pytest.raises(ConfigError, match=r"plug-in 'plugin_b' .* registers the method 'twice', which plug-in 'plugin_a' "
                                          r"\(entry point plugin_a = plugin_a of fedrepro-a 0.1\) already registers"):
        project()


# ---- extensions: twins of the baseline rows ------------------------------------------------------

def test_the_method_joins_every_table_with_a_fedavg_row_and_the_check_says_what_it_skipped(plugins):
    distribution(plugins / "site", "fedrepro-mine", "mine_plugin", METHOD_MODULE.format(name="mine", inputs=registry.INPUTS))
    proj = project(extension(mine={"label": "Mine", "params": {"beta": 0.3}, "papers": ["fediic", "facmic"]}))
    table = proj.papers["fediic"]["tables"]["table1"]
    assert [r["method"] for r in table["rows"]] == ["fedavg", "mine", "fediic"]
    assert list(proj.papers["fediic"]["tables"]) == ["table1"] and proj.papers["facmic"]["tables"] == {}
    notes = "\n".join(proj.extension.notes())
    assert "fediic/table1: rows Mine" in notes
    assert "fediic/imbalance skipped: a class_balance table" in notes
    assert "facmic/table2 skipped: for Mine: no row of fedavg (its like:) to swap it into; its rows: FACMIC, FedCLIP" in notes
    # the twin runs as the FedAvg row beside it: the same train block, the extension's method and params
    fedavg = proj.resolver.run_config(proj.resolver.run_key("fediic", "lt_creff", "fedavg", 0))
    mine = proj.resolver.run_config(proj.resolver.run_key("fediic", "lt_creff", "mine", 0))
    assert mine["train"] == fedavg["train"] and mine["split_id"] == fedavg["split_id"]
    assert mine["algorithm"] == {"name": "mine", "params": {"beta": 0.3}}
    # the extension's reports go beside the configuration's own results (the demo's: results/demo)
    assert paths.table("clean", "fediic", "table1") == f"{proj.config['results_dir']}/extensions/mine/tables/clean/fediic/table1.md"


def test_a_method_that_cannot_train_the_rows_runs_is_skipped_saying_why(plugins):
    distribution(plugins / "site", "fedrepro-feat", "feat_plugin", METHOD_MODULE.format(name="featonly", inputs=("features",)))
    proj = project(extension(featonly={"papers": ["fediic"]},
                             mine2={"method": "fedprox", "label": "FedProx 2", "papers": ["fediic"]}))
    notes = "\n".join(proj.extension.notes())
    assert ("fediic/table1 skipped: row featonly: featonly trains features (classification, retrieval; as plug-in "
            "'feat_plugin' (entry point feat_plugin = feat_plugin of fedrepro-feat 0.1) registers it)") in notes and "these runs train proj_classifier on images (classification)" in notes
    assert [r["method"] for r in proj.papers["fediic"]["tables"]["table1"]["rows"]] == ["fedavg", "mine2", "fediic"]
    assert "featonly" not in proj.papers["fediic"]["methods"]


def test_an_extension_that_fits_nowhere_says_why_for_every_table(plugins):
    with pytest.raises(ConfigError, match=r"(?s)config: extension \(mine\) adds nothing to any table:\n.*facmic/table2 skipped: "
                                          r"for mine2: no row of fedavg"):
        project(extension(mine2={"method": "fedprox", "papers": ["facmic"]}))


def test_params_the_schema_rejects_and_misspelt_keys_stop_before_any_job(plugins):
    distribution(plugins / "site", "fedrepro-mine", "mine_plugin", METHOD_MODULE.format(name="mine", inputs=registry.INPUTS))
    with pytest.raises(ConfigError, match=r"config: extension/methods/mine/params: 'beta' = 3 is out of range; allowed: 0 <= value <= 1"):
        project(extension(mine={"params": {"beta": 3}, "papers": ["fediic"]}))
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['paper'\] under 'extension/methods/mine'.*did you mean 'papers'"):
        project(extension(mine={"paper": ["fediic"]}))
    with pytest.raises(ConfigError, match=r"extension/methods/mine/papers.*'fedic' is not allowed \(did you mean 'fediic'\?\)"):
        project(extension(mine={"papers": ["fedic"]}))
    with pytest.raises(ConfigError, match=r"extension/methods/mine/method.*'mnie' is not allowed \(did you mean 'mine'\?\)"):
        project(extension(mine={"method": "mnie", "papers": ["fediic"]}))


def test_adding_an_extension_changes_no_builtin_run_or_definition(plugins):
    from fedrepro.report.definitions import definition_hash, evidence_definition, item_definition, scorecard_definition
    from fedrepro.report.tables import table_item

    def fingerprint(proj):
        runs = {k: proj.resolver.run_config(k)["config_hash"] for k in proj.plan.runs()}
        tables = {(p, t): definition_hash(item_definition(table_item(proj, protocol, p, t)))
                  for protocol, p, t in proj.plan.tables()}
        cards = {p: definition_hash(scorecard_definition(proj, p)) for p in [*proj.papers, "all"]}
        return runs, tables, cards, definition_hash(evidence_definition(proj)), paths.table("clean", "fediic", "table1")

    before = fingerprint(project())
    extended = project(extension(mine2={"method": "fedprox", "params": {"mu": 0.1}, "papers": ["fediic"]}))
    runs = {k: extended.resolver.run_config(k)["config_hash"] for k in extended.plan.runs()}
    shared = set(runs) & set(before[0])
    assert shared and all(runs[k] == before[0][k] for k in shared)       # the baselines' runs are the very same
    assert {k.method for k in set(runs) - shared} == {"mine2"}
    assert paths.table("clean", "fediic", "table1") != before[4]          # its reports go elsewhere
    assert fingerprint(project()) == before                               # and removing it changes nothing


# ---- folder datasets ------------------------------------------------------------------------------

def shapes(folder: Path, rows: list[tuple[str, str]], broken: str | None = None) -> dict:
    (folder / "images").mkdir(parents=True)
    for i, (name, label) in enumerate(rows):
        Image.new("RGB", (8, 8), (40 * i % 255, 0, 0)).save(folder / "images" / name)
    if broken:
        (folder / "images" / broken).write_bytes(b"not a png at all")
        rows = [*rows, (broken, "circle")]
    pd.DataFrame(rows, columns=["path", "class_name"]).assign(source="site").to_csv(folder / "labels.csv", index=False)
    return {"images": str(folder / "images"), "labels": str(folder / "labels.csv"), "classes": ["circle", "square"]}


def with_dataset(declaration: dict, split: dict | None = None) -> dict:
    return {"datasets": {"toy": declaration}, "extension": {"name": "toy", "settings": {"toy": {
        "dataset": "toy", "split": split or {"kind": "iid", "clients": 2, "global_test": {"fraction": 0.25}},
        "papers": {"fediic": "lt_creff"}}}}}


SPLITTER_MODULE = '''
import numpy as np
from fedrepro.registry import splitter


@splitter("halves")
def halves(labels, sources, spec, rng):
    """The pool cut in two at spec["options"]["at"]: a researcher's own splitter."""
    order = rng.permutation(len(labels))
    cut = int(len(labels) * spec["options"]["at"])
    return [np.sort(order[:cut]), np.sort(order[cut:])]
'''


def test_a_plugin_splitter_splits_a_folder_dataset(plugins):
    from fedrepro.data.partition import make_split

    distribution(plugins / "site", "fedrepro-halves", "halves_plugin", SPLITTER_MODULE)
    rows = [(f"{c}{i}.png", c) for c in ("circle", "square") for i in range(10)]
    split = {"kind": "halves", "options": {"at": 0.25}, "ratios": {"train": 1.0, "val": 0.0, "test": 0.0}}
    proj = project(with_dataset(shapes(plugins / "toy", rows), split))
    spec = proj.resolver.setting("fediic", "toy")["split"]
    manifest = pd.DataFrame({"label": [0] * 10 + [1] * 10, "source": "", "split": "", "path": [r[0] for r in rows]})
    parts = make_split(manifest, spec, 0)
    assert [len(parts.clients[c]["train"]) for c in sorted(parts.clients)] == [5, 15]
    with pytest.raises(ConfigError, match=r"split/kind: 'halvs' is not allowed \(did you mean 'halves'\?\)"):
        project(with_dataset(shapes(plugins / "toy2", rows), {**split, "kind": "halvs"}))


def test_a_folder_dataset_becomes_a_setting_of_twin_tables(plugins):
    rows = [(f"{c}{i}.png", c) for c in ("circle", "square") for i in range(6)]
    proj = project(with_dataset(shapes(plugins / "toy", rows)))
    tables = proj.papers["fediic"]["tables"]
    assert set(tables) == {"table1@toy", "imbalance@toy"}
    assert {c["setting"] for c in tables["table1@toy"]["columns"]} == {"toy"} and "published" not in tables["table1@toy"]
    # its columns and caption name the dataset it reads, not the paper's ("ISIC BACC" read lt_creff)
    assert [c["label"] for c in tables["table1@toy"]["columns"]] == ["toy BACC", "toy F1", "toy ACC"]
    assert tables["table1@toy"]["title"].startswith("On toy (dataset toy") and "in place of Fashion-LT" in tables["table1@toy"]["title"]
    assert "'toy BACC', 'toy F1', 'toy ACC' in place of 'ISIC BACC', 'ISIC F1', 'ISIC ACC'" in tables["table1@toy"]["note"]
    assert tables["imbalance@toy"]["settings"] == ["toy"]
    key = proj.resolver.run_key("fediic", "toy", "fediic", 0)
    assert proj.resolver.run_config(key)["train"] == proj.resolver.run_config(
        proj.resolver.run_key("fediic", "lt_creff", "fediic", 0))["train"]          # trains as lt_creff does
    assert registry.DATASETS.get("toy").origin == "config"
    environment = proj.job_environment()
    assert '"classes": ["circle", "square"]' in environment[registry.DATASETS_ENV]


def test_an_unknown_label_a_missing_and_an_unreadable_image_are_named(plugins):
    rows = [(f"{c}{i}.png", c) for c in ("circle", "square") for i in range(3)]
    declaration = shapes(plugins / "a", rows)
    labels = pd.read_csv(declaration["labels"])
    labels.loc[4, "class_name"] = "sqare"
    labels.to_csv(declaration["labels"], index=False)
    with pytest.raises(ConfigError, match=r"config: datasets/toy: labels .*labels.csv:\n  line 6: class 'sqare' is not one "
                                          r"of the classes \['circle', 'square'\] \(did you mean 'square'\?\)"):
        project(with_dataset(declaration))

    declaration = shapes(plugins / "b", rows, broken="circle9.png")
    with pytest.raises(ConfigError, match=r"config: datasets/toy: 1 image\(s\) listed in .* cannot be read:\n  "
                                          r".*circle9.png: UnidentifiedImageError"):
        project(with_dataset(declaration))

    declaration = shapes(plugins / "c", rows)
    os.remove(Path(declaration["images"]) / "square1.png")
    with pytest.raises(ConfigError, match=r"1 image\(s\) listed in .* are not in .*\n  .*square1.png"):
        project(with_dataset(declaration))


def test_a_folder_dataset_may_not_take_a_builtin_name(plugins):
    declaration = shapes(plugins / "d", [("a.png", "circle"), ("b.png", "square")])
    with pytest.raises(ConfigError, match=r"config: datasets/demo_bt: fedrepro itself \(built in\) already declares a dataset of this name"):
        project({"datasets": {"demo_bt": declaration}})


def test_the_download_step_links_the_folder_and_the_manifest_keeps_its_columns(plugins):
    from fedrepro.data import folder
    from fedrepro.data.download import download_dataset
    from fedrepro.data.prepare import prepare_dataset

    declaration = shapes(plugins / "e", [("a.png", "circle"), ("b.png", "square"), ("c.png", "circle")])
    spec = folder.declare({"toy": declaration})[0]
    raw = plugins / "raw"
    download_dataset(spec, raw)
    assert (raw / "toy" / "images").is_symlink() and (raw / "toy" / ".complete").exists()
    manifest = prepare_dataset(spec, raw, manifest_dir=plugins)
    assert list(manifest["path"]) == ["toy/images/a.png", "toy/images/b.png", "toy/images/c.png"]
    assert list(manifest["label"]) == [0, 1, 0] and set(manifest["source"]) == {"site"}
    assert all((raw / p).is_file() for p in manifest["path"])


# ---- the report side and the fork-server ------------------------------------------------------------

def test_the_scorecard_lists_the_extension_cells_as_unpublished_and_does_not_count_them(tmp_path):
    from fedrepro.report import scorecard

    csv = tmp_path / "t.csv"
    pd.DataFrame({"row": ["FedAvg", "Mine", "FedAvg"], "column": ["acc", "acc", "f1"], "mean": [50.0, 52.0, 40.0],
                  "ci95": [1.0, 1.0, 1.0], "n": [3, 3, 3], "published": [50.5, None, None]}).to_csv(csv, index=False)
    card = scorecard.build([("p", "t", "clean", csv)], {("p", "t"): {"rows": {"Mine"}, "columns": set(), "all": False}})
    assert list(zip(card["row"], card["verdict"])) == [("FedAvg", "reproduced"), ("Mine", "unpublished")]
    line = scorecard.summary_line(card)
    assert line.startswith("p (clean): of the 1 published numbers that could be judged, 1 reproduced"), line
    assert line.endswith("And 1 numbers of the extension, which have no published value."), line
    assert len(scorecard.build([("p", "t", "clean", csv)])) == 1      # without an extension: as before


def test_a_forked_job_sees_what_its_environment_adds_to_the_import_path(tmp_path, monkeypatch):
    from fedrepro import forkserver

    extra, site_dir = tmp_path / "extra", tmp_path / "site"
    extra.mkdir()
    site_dir.mkdir()
    (tmp_path / "editable").mkdir()
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(forkserver._SITE, "pth", set())
    (site_dir / "__editable__.mine.pth").write_text(str(tmp_path / "editable") + "\n")
    monkeypatch.setattr(forkserver, "_pth_files", lambda: {str(site_dir / "__editable__.mine.pth")})
    monkeypatch.setenv("PYTHONPATH", str(extra))
    forkserver.refresh_import_path()
    assert str(extra) in sys.path and str(tmp_path / "editable") in sys.path


def test_a_twin_in_an_overlay_paper_gets_what_the_overlay_gives_its_baseline(plugins):
    """The evidence run's FedDRA overlay gives FedMAE a ViT of its own; FedMAE's twin trains that ViT too."""
    proj = load_project([ROOT / "config/evidence.yaml"], root=ROOT, overrides={
        "papers": ["feddra"], "extension": {"name": "ev", "methods": {"mine3": {
            "method": "fedprox", "like": "fedmae", "papers": ["feddra"]}}}})
    setting = next(iter(proj.papers["feddra"]["settings"]))
    twin, base = (proj.resolver.run_config(proj.resolver.run_key("feddra", setting, m, 0)) for m in ("mine3_convirt", "fedmae_convirt"))
    assert twin["train"]["model"]["image"]["backbone"] == "test_vit" and twin["train"] == base["train"]


# ---- a method checks its run, code changes are seen, cost estimates fail loudly --------------------

SGD_ONLY = '''
from fedrepro.methods.fedavg import FedAvg
from fedrepro.registry import register_method


@register_method("sgdonly")
class SgdOnly(FedAvg):
    @classmethod
    def check_run(cls, params, train):
        name = train["optimizer"]["name"]
        return [] if name == "sgd" else [f"train/optimizer/name is {name!r}: its correction assumes plain SGD"]
'''


def config_file(folder: Path, extra: dict) -> Path:
    """A configuration file of the test's papers and ``extra``, for the command line (after config/demo.yaml)."""
    import yaml

    path = folder / "mine.yaml"
    path.write_text(yaml.safe_dump({**PAPERS, **extra}))
    return path


def test_a_method_that_cannot_run_under_its_baselines_train_block_is_refused_in_one_line(plugins, caplog):
    from fedrepro.cli import main

    distribution(plugins / "site", "fedrepro-sgd", "sgd_plugin", SGD_ONLY)
    with pytest.raises(ConfigError) as refused:
        project(extension(sgdonly={"papers": ["fediic"]}))
    message = str(refused.value)
    assert "\n" not in message, message          # the demo's 3 seeds and both protocols: one line
    assert message.startswith("config: extension/methods/sgdonly (as fediic's fedavg, whose train block it runs with) "
                              "on settings lt_creff (clean): method sgdonly (plug-in 'sgd_plugin'")
    assert message.endswith("train/optimizer/name is 'adam': its correction assumes plain SGD")
    with pytest.raises(SystemExit):
        main(["validate", "--configfile", str(DEMO[0]), str(config_file(plugins, extension(sgdonly={"papers": ["fediic"]})))])
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [message]
    # the built-in methods use the same hook: FedIIC's contrastive terms need two views per image
    train = load_project(DEMO, overrides=PAPERS, root=ROOT).resolver.train_config("fediic", "lt_creff", "fedavg", "clean")
    assert registry.run_problems("fediic", {"k1": 1.0, "k2": 0.0}, train) == [
        "method fediic (the built-in fedrepro.methods.fediic): train/model/views is 1, but FedIIC with k1=1.0, k2=0.0 "
        "contrasts two views per image: set train.model.views: 2 (family proj_classifier), or k1 = k2 = 0"]


def test_a_model_family_refuses_a_train_block_too_and_a_failing_hook_is_named(plugins):
    from fedrepro.models.families import ModelFamily

    @registry.register_model("fp32_only", input="features")
    class Fp32Only(ModelFamily):
        @classmethod
        def check_run(cls, params, train):
            if params.get("width", 1) < 0:
                raise KeyError("width")
            return [] if train["precision"] == "fp32" else [f"train/precision is {train['precision']!r}: fp32 only"]

    train = {"model": {"family": "fp32_only"}, "precision": "amp", "optimizer": {"name": "sgd", "lr": 0.1}}
    [refused] = registry.run_problems("fedavg", {}, train)
    assert refused.startswith("model family fp32_only (") and refused.endswith("train/precision is 'amp': fp32 only")
    assert registry.run_problems("fedavg", {}, {**train, "precision": "fp32"}) == []
    [failed] = registry.run_problems("fedavg", {}, {**train, "model": {"family": "fp32_only", "width": -1}})
    assert "its check_run failed: KeyError: 'width' (at " in failed and "test_plugins.py:" in failed


BROKEN_LAYOUT = '''
from fedrepro.methods.fedavg import FedAvg
from fedrepro.registry import register_method


@register_method("meta_broken")
class MetaBroken(FedAvg):
    def memory_layout(self):
        return {"device_models": 2 + len(self.velocity), "per_client": {}, "host_extra": 0}   # setup() makes velocity
'''


def test_a_broken_memory_layout_is_named_by_validate_and_nothing_wrong_is_cached(plugins, monkeypatch):
    from fedrepro.cli import plugin_memory_failures
    from fedrepro.cost import memory

    profiles = plugins / "profiles"
    monkeypatch.setattr(paths, "model_profile", lambda key: str(profiles / f"{key}.json"))
    folder = distribution(plugins / "site", "fedrepro-meta", "meta_plugin", BROKEN_LAYOUT)
    proj = project(extension(meta_broken={"papers": ["fediic"]}))
    [line] = plugin_memory_failures(proj)
    assert line.startswith("warning: no memory estimate: model family 'proj_classifier' (the built-in ")
    assert ("with method 'meta_broken' (plug-in 'meta_plugin' (entry point meta_plugin = meta_plugin of fedrepro-meta "
            "0.1)) cannot be built on the meta device for the memory estimate: AttributeError: ") in line
    assert "meta_plugin.py:9)" in line and "without setup()" in line and "mem_mb=32000" in line
    assert not profiles.exists() or not list(profiles.iterdir())          # nothing of the failure is on disk
    key = proj.resolver.run_key("fediic", "lt_creff", "meta_broken", 0)
    failed = memory.profile_key(proj.resolver.run_config(key))
    # the fix: a new version of the module (a new process would import it; here it is imported again)
    (folder / "meta_plugin.py").write_text(BROKEN_LAYOUT.replace("2 + len(self.velocity)", "3"))
    registry.METHODS.discard("meta_broken", "meta_plugin")
    with registry._registering_as("meta_plugin"):
        importlib.reload(sys.modules["meta_plugin"])
    assert memory.profile_key(proj.resolver.run_config(key)) != failed        # its code is part of the key
    assert plugin_memory_failures(proj) == []
    [cached] = profiles.iterdir()
    assert '"device_models": 3' in cached.read_text()


def test_a_module_digest_sees_code_not_comments_docstrings_or_layout():
    from fedrepro.code_identity import source_digest

    code = 'def f(x):\n    """Twice x."""\n    return 2 * x   # doubled\n'
    same = '# a module\n\ndef f(x):\n    """Two times x,\n    as the paper says."""\n    return (2\n            * x)\n'
    assert source_digest(code) == source_digest(same)
    assert source_digest(code) != source_digest(code.replace("2 * x", "3 * x"))
    assert source_digest('def f():\n    """Only a docstring."""\n') == source_digest("def f():\n    pass\n")


def test_a_components_digest_covers_its_classes_and_what_they_use_not_the_rest_of_their_module():
    """Two families in one module, on one base class: editing one (or a helper only it uses) leaves the other's code
    as it was; editing the base class, a helper or constant the component names (through another), or an import it
    uses changes it."""
    from fedrepro.code_identity import source_digest

    module = '''import math
import torch

SCALE = 2.0
DEFAULTS = {"scale": SCALE}


def helper(x):
    return math.sqrt(x)


def clip_only(x):
    return torch.tanh(x)


class Base:
    def loss(self, x):
        return x


class Mine(Base):
    params = DEFAULTS

    def forward(self, x):
        return helper(x)


class Clip(Base):
    def forward(self, x):
        return clip_only(x)
'''
    mine = ["Mine", "Base"]
    made = source_digest(module, mine)
    for unrelated in (("torch.tanh(x)", "torch.sigmoid(x)"), ("return clip_only(x)", "return 2 * clip_only(x)")):
        assert source_digest(module.replace(*unrelated), mine) == made, unrelated
        assert source_digest(module.replace(*unrelated), ["Clip", "Base"]) != source_digest(module, ["Clip", "Base"])
    for related in (("return x\n", "return 2 * x\n"), ("math.sqrt(x)", "math.exp(x)"), ("SCALE = 2.0", "SCALE = 3.0"),
                    ("import math", "import cmath as math")):
        assert source_digest(module.replace(*related), mine) != made, related
    assert source_digest(module.replace("return helper(x)", "return helper(x)  # the root"), mine) == made


MINE_WITH_NOTE = METHOD_MODULE.format(name="mine", inputs=registry.INPUTS) + '''
    @classmethod
    def caption_note(cls, params):
        return f"Mine uses beta {params['beta']}"
'''


def test_a_change_of_a_methods_code_or_version_marks_its_runs_and_a_comment_does_not(plugins, monkeypatch, capsys):
    import json
    import subprocess

    from fedrepro.cli import main
    from fedrepro.code_identity import run_code
    from fedrepro.report.code_changes import check_code, code_note
    from fedrepro.report.definitions import definition_hash, item_definition
    from fedrepro.report.tables import method_notes, table_item

    folder = distribution(plugins / "site", "fedrepro-mine", "mine_plugin", MINE_WITH_NOTE)
    for shared in ("config", "workflow"):       # the command line reads them from the working folder
        (plugins / shared).symlink_to(ROOT / shared)
    monkeypatch.chdir(plugins)                  # and the runs written below go here
    mine = extension(mine={"label": "Mine", "params": {"beta": 0.3}, "papers": ["fediic"]})
    proj = project(mine)
    keys = proj.plan.table_runs("fediic", "table1", "clean")
    unknown = next(k for k in keys if k.method == "fediic")
    for key in keys:            # every run made, by the code installed now; one before fedrepro recorded code
        code = {} if key == unknown else run_code(proj.resolver.run_config(key))
        Path(paths.run_dir(key)).mkdir(parents=True)
        Path(paths.run_file(key, "run_manifest.json")).write_text(json.dumps({"code": code}))
        Path(paths.run_file(key)).write_text("{}")

    def table():
        return definition_hash(item_definition(table_item(proj, "clean", "fediic", "table1")))

    made, check = table(), check_code(proj, keys)
    # every run current: the definitions are those of a grid before runs recorded code (nothing to make again)
    assert "code" not in item_definition(table_item(proj, "clean", "fediic", "table1"))
    assert not check.changed and check.unknown == [unknown] and code_note(proj, keys) is None
    assert method_notes(table_item(proj, "clean", "fediic", "table1")) == ["Mine uses beta 0.3."]   # said once
    module = folder / "mine_plugin.py"
    module.write_text("# tuned\n" + module.read_text().replace("standing for", "that stands for"))
    assert not check_code(proj, keys).changed and table() == made        # a comment and a docstring: nothing
    module.write_text(module.read_text() + "\n    scale = 2.0\n")
    mine_runs = [k for k in keys if k.method == "mine"]
    check = check_code(proj, keys)
    assert check.changed == {k: ["method mine: mine_plugin changed"] for k in mine_runs}
    assert table() != made                                                # the table is made again, the runs are not
    assert item_definition(table_item(proj, "clean", "fediic", "table1"))["code"] == {
        k.path: ["method mine: mine_plugin changed"] for k in mine_runs}
    n = len(mine_runs)
    assert code_note(proj, keys).startswith(f"Made by other code than the installed one: Mine ({n} of {n} runs: "
                                            f"method mine: mine_plugin changed).")
    info = next(folder.glob("*.dist-info")) / "METADATA"
    info.write_text(info.read_text().replace("Version: 0.1", "Version: 0.2"))
    assert check_code(proj, keys).changed[mine_runs[0]] == ["method mine: fedrepro-mine 0.1 then, 0.2 now",
                                                             "method mine: mine_plugin changed"]

    config = config_file(plugins, mine)
    main(["stale", "--configfile", str(DEMO[0]), str(config)])
    out = capsys.readouterr().out
    files = [paths.run_file(k) for k in mine_runs]
    assert f"every output of the configuration: {len(keys)} of its {len(keys)} run(s) made, {n} of them by other code " in out
    assert "1 run(s) record no code (made before fedrepro recorded it): unknown" in out
    assert all(f"    {k.path}\n" in out for k in mine_runs) and unknown.path not in out
    command = ["snakemake", "all", "--cores", "all", "--configfile", str(DEMO[0]), str(config), "--forcerun", *files]
    assert f"rerun them (and what is made from them): {' '.join(command)}" in out
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: ran.append(argv) or subprocess.CompletedProcess(argv, 0))
    main(["stale", "--rerun", "--configfile", str(DEMO[0]), str(config)])
    assert ran == [[sys.executable, "-m", *command]]


# ---- the worked stateful example of docs/plugins.md, as it is printed there --------------------------

LINEAR = "doc_linear"
DOC_PAPER = {
    "paper": "doc", "title": "The worked example of docs/plugins.md",
    "defaults": {"rounds": 3, "batch_size": 4, "local": {"steps": 3}, "optimizer": {"name": "sgd", "lr": 0.2},
                 "model": {"family": LINEAR}, "aggregation": {"weights": "train_size"}, "selection": {"rule": "last"},
                 "precision": "fp32"},
    "settings": {"three": {"dataset": "demo_fashion", "split": {"kind": "iid", "clients": 3}}},
    "methods": {"fedavg": {}, "scaffold": {}},
}


def documented_example() -> str:
    """The Python block of docs/plugins.md that begins with ``# scaffold.py``."""
    import re

    text = (ROOT / "docs/plugins.md").read_text()
    [code] = re.findall(r"```python\n(# scaffold\.py.*?)```", text, re.S)
    return code


def test_the_stateful_example_of_the_docs_runs_as_it_says(plugins):
    """SCAFFOLD as docs/plugins.md prints it, driven through the engine: the server's c is the mean of the clients'
    c_i after every round (full participation), the first round is FedAvg's (c = c_i = 0) and the later ones are not,
    c travels with the model (twice FedAvg's bytes down), a resumed run ends where a whole one does, it refuses Adam,
    and its memory layout is read without setup()."""
    import logging
    import types

    import numpy as np
    import torch
    import yaml
    from torch import nn

    from fedrepro.config import Project
    from fedrepro.data.loader import FeatureSet
    from fedrepro.fl.comm import CommLedger
    from fedrepro.fl.engine import run_rounds
    from fedrepro.fl.federation import ClientData, Federation
    from fedrepro.fl.method import MethodContext
    from fedrepro.models.families import ModelFamily, Output, build_family

    @registry.register_model(LINEAR, input="features")
    class Linear(ModelFamily):
        input_kind = "features"

        def build(self):
            return nn.Linear(5, self.num_classes)

        def forward(self, model, batch):
            logits = model(batch["x"])
            return Output(logits=logits, features=batch["x"], objective=[(logits, batch["y"])])

    module = types.ModuleType("scaffold_doc")           # a plug-in module: what registers it is its own
    sys.modules["scaffold_doc"] = module
    exec(compile(documented_example(), str(ROOT / "docs/plugins.md"), "exec"), module.__dict__)
    (plugins / "papers").mkdir()
    (plugins / "papers/doc.yaml").write_text(yaml.safe_dump(DOC_PAPER))
    proj = Project({"papers": ["doc"], "paper_dir": str(plugins / "papers"), "seeds": [0]}, root=ROOT)

    def federation():
        gen = torch.Generator().manual_seed(3)

        def part(n, shift):
            y = torch.randint(0, 3, (n,), generator=gen)
            return FeatureSet(torch.randn(n, 5, generator=gen) + shift * nn.functional.one_hot(y, 5).float(), y,
                              np.arange(n))
        return Federation([ClientData(f"client{k}", k, part(n, 1 + k), part(3, 1), part(3, 1))
                           for k, n in enumerate((10, 14, 7))], part(6, 1), None, ["a", "b", "c"])

    def drive(method, rounds, checkpoint, record=None):
        train = {**proj.resolver.train_config("doc", "three", method, "clean"), "num_workers": 0, "rounds": rounds}
        run = {"paper": "doc", "setting": "three", "method": method, "seed": 0, "protocol": "clean",
               "algorithm": {"name": method, "params": {}}, "train": train, "config_hash": method}
        fed = federation()
        algorithm = registry.method_class(method)(MethodContext(run, fed, torch.device("cpu"), CommLedger(),
                                                                logging.getLogger("test")))
        if record is not None:
            aggregate = algorithm.aggregate

            def recording(updates, rnd):
                aggregate(updates, rnd)
                record.append({"c": {k: v.clone() for k, v in algorithm.c.items()},
                               "c_i": [algorithm.controls[c.name] for c in fed.clients]})
            algorithm.aggregate = recording
        run_rounds(algorithm, fed, run, checkpoint)
        return algorithm

    record = []
    scaffold = drive("scaffold", 3, plugins / "a.pt", record)
    for entry in record:
        for k, c in entry["c"].items():
            assert torch.allclose(c, sum(c_i[k] for c_i in entry["c_i"]) / 3, atol=1e-6), k
    assert any(c.abs().max() > 1e-3 for c in record[-1]["c"].values())
    one = [drive(m, 1, plugins / f"{m}1.pt").server.state_dict() for m in ("fedavg", "scaffold")]
    assert all(torch.allclose(one[0][k], one[1][k], atol=1e-6) for k in one[0])
    fedavg = drive("fedavg", 3, plugins / "f.pt")
    assert any(not torch.allclose(fedavg.server.state_dict()[k], v, atol=1e-4) for k, v in scaffold.server.state_dict().items())
    assert scaffold.ctx.comm.round_totals(0)["down_bytes"] == 2 * fedavg.ctx.comm.round_totals(0)["down_bytes"]
    drive("scaffold", 2, plugins / "b.pt")                        # stops after round 2 ...
    resumed = drive("scaffold", 3, plugins / "b.pt")              # ... and goes on from its checkpoint
    for k, v in scaffold.server.state_dict().items():
        assert torch.allclose(resumed.server.state_dict()[k], v, atol=1e-6), k
    assert all(torch.allclose(resumed.controls["client1"][k], scaffold.controls["client1"][k], atol=1e-6) for k in scaffold.keys)

    adam = {**proj.resolver.train_config("doc", "three", "scaffold", "clean"), "optimizer": {"name": "adam", "lr": 0.1}}
    [refused] = registry.run_problems("scaffold", {}, adam)
    assert refused.startswith("method scaffold (plug-in 'scaffold_doc'): train/optimizer is adam (momentum 0)")
    shell = registry.method_class("scaffold")(MethodContext({"train": adam, "algorithm": {"params": {}}, "seed": 0},
                                                            federation(), torch.device("cpu"), CommLedger(),
                                                            logging.getLogger("test")))
    shell.family = build_family(adam["model"], ["a", "b", "c"], {})
    shell.server = shell.build_model()
    shell.shared = shell.shared_keys()
    layout = shell.memory_layout()                               # as the memory estimate calls it: no setup()
    assert layout["device_models"] == 3 and layout["per_client"]["controls"] == (5 * 3 + 3) * 4
