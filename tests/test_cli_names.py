"""Command-line mistakes: a name that is not there (dataset, paper, setting, method, table, figure, weights kind)
stops with one line that names it, suggests the closest and lists the rest, as configuration typos do; never a
KeyError traceback (issue 34, item 6)."""

import json
import logging

import pytest

from fedrepro.cli import main
from fedrepro.config import load_project
from fedrepro.registry import UnknownName, check_name

TINY = ["config/config.yaml", "tests/data/infra/config.yaml"]     # one paper (foundation), one setting, one method


def error_line(argv, caplog, capsys) -> str:
    """Run ``fedrepro <argv>``: it must exit 1 with exactly one error line and no traceback."""
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="fedrepro"), pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert "Traceback" not in capsys.readouterr().err
    return errors[0]


def test_an_unknown_dataset_is_one_line_with_a_suggestion(caplog, capsys):
    line = error_line(["download", "isic2018", "--raw-dir", "unused"], caplog, capsys)
    assert line.startswith("unknown dataset 'isic2018' (did you mean 'isic2019'?); known: [")
    line = error_line(["download", "isic2018", "--check"], caplog, capsys)
    assert "did you mean 'isic2019'" in line


def test_estimate_names_the_wrong_paper_setting_or_method(caplog, capsys):
    config = ["--configfile", *TINY]
    assert error_line(["estimate", "foundaton", "bt_iid", "fedclip", *config], caplog, capsys) == (
        "unknown paper 'foundaton' in this configuration (did you mean 'foundation'?); known: ['foundation']")
    assert error_line(["estimate", "foundation", "bt_idd", "fedclip", *config], caplog, capsys) == (
        "unknown setting 'bt_idd' in paper foundation (did you mean 'bt_iid'?); known: ['bt_iid']")
    assert error_line(["estimate", "foundation", "bt_iid", "fedclp", *config], caplog, capsys) == (
        "unknown method 'fedclp' in paper foundation (did you mean 'fedclip'?); known: ['fedclip']")


def test_table_figure_and_scorecard_commands_name_the_unknown_item(caplog, capsys, tmp_path):
    project = load_project(TINY)
    config = ["--config-json", json.dumps(project.config)]
    line = error_line(["table", *config, "--protocol", "clean", "--paper", "foundation", "--table", "acuracy",
                       "--out", str(tmp_path / "t.md")], caplog, capsys)
    assert line.startswith("unknown table 'acuracy' in paper foundation (did you mean 'accuracy'?)")
    line = error_line(["figure", *config, "--protocol", "clean", "--paper", "foundation", "--figure", "curve",
                       "--out", str(tmp_path / "f.png")], caplog, capsys)
    assert line.startswith("unknown figure 'curve' in paper foundation (did you mean 'curves'?)")
    line = error_line(["scorecard", *config, "--paper", "fondation", "--out", str(tmp_path / "s.html")], caplog, capsys)
    assert line.startswith("unknown paper 'fondation' in this configuration (did you mean 'foundation'?)")


def test_an_unknown_weights_kind_suggests_the_known_one(caplog, capsys):
    line = error_line(["weights", "open_clp--ViT-B-16--openai", "--list"], caplog, capsys)
    assert "unknown weights kind 'open_clp'" in line and "did you mean 'open_clip'" in line


def test_one_helper_words_every_unknown_name():
    """The registries and the configuration's own names go through the same helper (fedrepro.registry.check_name);
    the error is a KeyError and a ValueError, so lookups that caught either still do."""
    from fedrepro.registry import METHODS

    with pytest.raises(UnknownName, match=r"^unknown method 'fedprx' \(did you mean 'fedprox'\?\); known: \[") as error:
        METHODS.get("fedprx")
    assert isinstance(error.value, KeyError) and isinstance(error.value, ValueError)
    assert str(error.value).startswith("unknown method")          # not KeyError's quoted repr
    with pytest.raises(UnknownName, match=r"unknown table 'x' in paper p; known: \['a', 'b'\]"):
        check_name("table", "x", {"b": 1, "a": 2}, "in paper p")
    check_name("table", "a", ["a"])                                 # a known name passes
