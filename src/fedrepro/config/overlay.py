"""Overlay paper files (``base:``; workflow/schemas/overlay.schema.yaml): another file's method variants, run on
other data at one scale. The evidence run (config/evidence.yaml) is made of these."""

from __future__ import annotations

import copy
import math
from pathlib import Path

from .files import ConfigError, check_choice, deep_merge, load_schema, load_yaml, method_schema, validate


class Overlay:
    """A paper file over another (``base:``; workflow/schemas/overlay.schema.yaml): the base file's method variants,
    with their params and train blocks, run on the overlay's settings, at one scale of rounds, local steps and
    batch size for every run, with the models swapped per family. The evidence run (config/evidence.yaml) is made of these:
    every variant of the full grid, on offline data, with the paper's hyper-parameters otherwise."""

    def __init__(self, spec: dict, root: Path, where: str):
        schema = load_schema(str(root.resolve()), "overlay.schema.yaml")
        self.spec = validate(copy.deepcopy(spec), schema, where)
        self.where = where
        base_path = root / self.spec["base"]
        self.base = load_yaml(base_path)
        if not isinstance(self.base, dict) or "base" in self.base:
            raise ConfigError(f"{where}: base {self.spec['base']} must be a paper file (not another overlay)")
        validate(self.base, load_schema(str(root.resolve()), "paper.schema.yaml"), str(base_path))
        if self.base["paper"] != self.spec["paper"]:
            raise ConfigError(f"{where}: base {self.spec['base']} is paper {self.base['paper']!r}, not {self.spec['paper']!r}")
        for method in self.spec["methods"]:
            check_choice(method, self.base["methods"], f"{where}: methods (the variants of {self.spec['base']})")

    def variants(self) -> list[str]:
        """Every method variant the base file runs: a row of one of its tables or a method of one of its figures."""
        used: dict[str, None] = {}
        for table in self.base.get("tables", {}).values():
            for row in table.get("rows", []):
                used.update(dict.fromkeys([row["method"]] if "method" in row else []))
                used.update(dict.fromkeys((row.get("methods") or {}).values()))
            for col in table.get("columns", []):
                used.update(dict.fromkeys([col["method"]] if "method" in col else []))
        for figure in self.base.get("figures", {}).values():
            used.update(dict.fromkeys(figure.get("methods", [])))
        return [m for m in self.base["methods"] if m in used]

    def paper(self, only: list[str] | None = None) -> dict:
        """The paper file this overlay stands for: the base's defaults, protocols and variants (each with the
        overlay's additions), the overlay's settings and one table of every variant x setting."""
        variants = self.variants()
        for name in only or []:
            check_choice(name, variants, f"config: variants/{self.spec['paper']} (the variants of {self.spec['base']})")
        rows = [m for m in variants if not only or m in only]
        methods = {m: deep_merge(self.base["methods"][m], {k: v for k, v in self.spec["methods"].get(m, {}).items()
                                                          if k != "train"}) for m in rows}
        if self.spec["models"]:
            # the base's authors_numerics name the precision of the authors' models (OpenAI's fp16 CLIP); the
            # stand-in models the overlay swaps in compute in fp32 (their pixel pipelines still follow the numerics)
            for variant in methods.values():
                variant.pop("authors_numerics", None)
        table = {"title": f"Every method variant of {self.spec['base']} on the evidence data "
                          f"({self.spec['table']['metric']}, {self.spec['table']['eval']}, %)",
                 "metric": self.spec["table"]["metric"], "eval": self.spec["table"]["eval"],
                 "rows": [{"method": m} for m in rows],
                 "columns": [{"label": s.get("label", name), "setting": name} for name, s in self.spec["settings"].items()],
                 "note": f"Scaled-down runs of the full grid's variants ({self.where}); not comparable to the paper."}
        paper = {"paper": self.spec["paper"], "title": self.spec["title"], "defaults": self.base["defaults"],
                 "settings": self.settings(), "methods": methods, "tables": {"evidence": table}}
        for key in ("notes", "stand_in", "protocols", "authors_numerics"):
            if key == "authors_numerics" and self.spec["models"]:
                continue
            source = self.base if key in ("protocols", "authors_numerics") else self.spec
            if key in source:
                paper[key] = source[key]
        return paper

    def stands_for(self, setting: str) -> str:
        """The base file's setting an overlay setting stands for (``stands_for``)."""
        return self.spec["settings"][setting]["stands_for"]

    def settings(self) -> dict:
        """The overlay's settings; one that ``stands_for`` a base setting trains as that one does (its train block:
        FACMIC's 100 rounds of 199 steps on BT, FedIIC's learning rate on Real), before the overlay's scale."""
        out = {}
        for name, setting in self.spec["settings"].items():
            setting = {k: v for k, v in setting.items() if k != "stands_for"}
            base = self.stands_for(name)
            check_choice(base, self.base["settings"], f"{self.where}: settings/{name}/stands_for")
            setting["train"] = deep_merge(self.base["settings"][base].get("train") or {}, setting.get("train"))
            out[name] = setting
        return out

    def apply_train(self, train: dict, method: str) -> dict:
        """A run's merged train block at the overlay's scale: its train additions, the family's model swap, the
        variant's own additions, then rounds, local steps and batch size scaled."""
        train = deep_merge(train, self.spec["train"])
        train["model"] = {**train["model"], **self.spec["models"].get(train["model"]["family"], {})}
        train = deep_merge(train, self.spec["methods"].get(method, {}).get("train"))
        train["rounds"] = scaled(train["rounds"], self.spec["scale"]["rounds"])
        train["batch_size"] = scaled(train["batch_size"], self.spec["scale"]["batch_size"])
        if "steps" in train.get("local", {}):
            train["local"]["steps"] = scaled(train["local"]["steps"], self.spec["scale"]["steps"])
        return train

    def scale_params(self, algorithm: str, params: dict) -> dict:
        """Method params whose schema says they count rounds or local steps (``x-counts``), scaled like them."""
        out = dict(params)
        for key, prop in method_schema(algorithm).get("properties", {}).items():
            kind = prop.get("x-counts")
            if kind and isinstance(out.get(key), int) and not isinstance(out[key], bool):
                out[key] = scaled(out[key], self.spec["scale"][kind])
        return out


def scaled(value: int, factor: float) -> int:
    """ceil(value x factor), at least 1 where value was (0 stays 0: 'none of it')."""
    return value if value <= 0 else max(1, math.ceil(value * factor - 1e-9))


