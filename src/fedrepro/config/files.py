"""The configuration files: YAML loading, schema validation with readable errors, and what the registry
says a config may name (method params, model families). Pure functions; nothing here knows a paper."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from ..registry import did_you_mean

SCHEMA_DIR = Path("workflow/schemas")


class ConfigError(ValueError):
    pass


# --------------------------------------------------------------------------------------------
# schema validation

class DuplicateKey(yaml.YAMLError):
    pass


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """libyaml's parser when PyYAML has it (the same documents, ~8x faster on the grid's YAML files), refusing
    a mapping that repeats a key: YAML would silently keep the last one. Keys merged in with ``<<: *anchor``
    may be overridden, as YAML intends."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int, float, bool)):
                    continue
                if key in seen:
                    raise DuplicateKey(f"duplicate key {key!r} at line {key_node.start_mark.line + 1} (first at line "
                                       f"{seen[key]}); YAML would keep only the last one: remove or rename one of them")
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def load_yaml(path: str | Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.load(fh, Loader=_Loader)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None


def check_config_files(files) -> None:
    """What Snakemake's own loader lets through in the files it was given (``--configfile``): repeated keys."""
    for path in files:
        load_yaml(path)


@lru_cache(maxsize=None)
def load_schema(root: str, name: str) -> dict:
    return load_yaml(Path(root) / SCHEMA_DIR / name)


@lru_cache(maxsize=None)
def _validator_with_defaults():
    # building the validator class costs ~4 ms; validate() runs for every run config of the grid
    from jsonschema import Draft202012Validator, validators

    check_properties = Draft202012Validator.VALIDATORS["properties"]

    def fill_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if isinstance(sub, dict) and "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from check_properties(validator, properties, instance, schema)

    return validators.extend(Draft202012Validator, {"properties": fill_defaults})


def validate(instance: Any, schema: dict, where: str) -> Any:
    """Validate (and fill defaults into) ``instance`` in place; raise ConfigError with a readable message.

    A grid validates the same blocks again and again (every setting of a paper resolves its methods' train blocks
    alike; planning the full grid validated 2,524 blocks, 1.4 s of its 1.9 s configuration check): an instance
    already found valid against the same schema object gets the defaults it was filled with, without a second walk
    through the schema."""
    key = None
    if isinstance(instance, dict):
        try:        # the keys in their order: a hit gives back the filled block exactly as validating it gave it
            key = (id(schema), json.dumps(instance))
        except (TypeError, ValueError):      # not plain JSON (a test's object): validated every time
            pass
    if key is not None and key in _VALID and _VALID[key][0] is schema:
        instance.clear()
        instance.update(json.loads(_VALID[key][1]))
        return instance
    validator = _validator_with_defaults()(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        raise ConfigError("\n".join(f"{where}: {describe_error(e)}" for e in errors[:5]))
    if key is not None:
        _VALID[key] = (schema, json.dumps(instance))    # the schema kept with it: its id stays its own
    return instance


_VALID: dict[tuple[int, str], tuple[dict, str]] = {}


def describe_error(error) -> str:
    if error.validator in ("oneOf", "anyOf") and error.context:
        error = closest_alternative(error.context)
    path = "/".join(map(str, error.absolute_path)) or "(top level)"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted((error.schema.get("properties") or {}).keys())
        unknown = [k for k in error.instance if k not in allowed]
        hints = "; ".join(did_you_mean(k, allowed) for k in unknown)
        return f"unknown key(s) {unknown} under '{path}'{hints}; allowed keys: {allowed}"
    if error.validator == "enum":
        allowed = error.validator_value
        return f"'{path}' = {error.instance!r} is not allowed{did_you_mean(error.instance, allowed)}; allowed values: {allowed}"
    if error.validator == "const":
        return f"'{path}' = {error.instance!r}, expected {error.validator_value!r}"
    if error.validator in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        return f"'{path}' = {error.instance!r} is out of range; allowed: {allowed_range(error.schema)}"
    return f"'{path}': {error.message}"


def allowed_range(schema: dict) -> str:
    """``{exclusiveMinimum: 0, maximum: 1}`` -> ``'0 < value <= 1'``."""
    low = next((f"{schema[k]} {'<' if k.startswith('exclusive') else '<='} " for k in ("exclusiveMinimum", "minimum")
                if k in schema), "")
    high = next((f" {'<' if k.startswith('exclusive') else '<='} {schema[k]}" for k in ("exclusiveMaximum", "maximum")
                 if k in schema), "")
    return f"{low}value{high}"


def closest_alternative(errors):
    """The error of the alternative (of a ``oneOf``/``anyOf``) the value was most likely meant as: one whose
    type fits, with the fewest errors, and in it the error that got deepest into the value
    (``{fraction: 1.5}`` is a fraction out of range, not a wrong choice among the strings ``none``/``official``)."""
    from jsonschema.exceptions import best_match

    branches: dict = {}
    for error in errors:
        branches.setdefault(error.schema_path[0] if error.schema_path else None, []).append(error)

    def misfit(error) -> bool:
        return not error.relative_path and (error.validator == "type" or (
            error.validator == "enum" and isinstance(error.instance, (dict, list))))

    closest = min(branches.values(), key=lambda errs: (any(map(misfit, errs)), len(errs)))
    deepest = max(len(e.relative_path) for e in closest)
    return best_match([e for e in closest if len(e.relative_path) == deepest])


def check_choice(value: str, allowed, where: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{where}: {value!r} is not allowed{did_you_mean(value, list(allowed))}; allowed values: {sorted(allowed)}")


# --------------------------------------------------------------------------------------------
# what a config may name: the registry (fedrepro.registry)

def method_schema(name: str) -> dict:
    from ..registry import METHODS

    return METHODS.get(name)["schema"]


def model_schema(family: str) -> dict:
    from ..registry import MODELS

    return MODELS.get(family)["schema"]


def input_kind(family: str) -> str:
    """What a model family trains on: ``features``, ``images`` or ``image_text``."""
    from ..registry import MODELS

    return MODELS.get(family)["input"]


def typed_overrides(config: dict, overrides) -> dict:
    """``config`` with the lists and mappings of ``snakemake --config key=value`` read as YAML reads them in a config
    file. Snakemake parses such a value with YAML's BaseLoader, which makes every item a string: ``seeds=[0,1]``
    would reach the schema as ``['0', '1']`` ("'0' is not of type 'integer'"). Scalars it types itself."""
    out = copy.deepcopy(config)

    def typed(value):
        if isinstance(value, str):
            parsed = yaml.safe_load(value) if value else value
            return parsed if isinstance(parsed, (bool, int, float)) or parsed is None else value
        if isinstance(value, list):
            return [typed(v) for v in value]
        if isinstance(value, dict):
            return {k: typed(v) for k, v in value.items()}
        return value

    def put(into: dict, key, value) -> None:
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            for k, v in value.items():
                put(into[key], k, v)
        else:
            into[key] = typed(value)

    for key, value in dict(overrides or {}).items():
        if isinstance(value, (list, dict)):
            put(out, key, value)
    return out


# --------------------------------------------------------------------------------------------
# merging config layers

def deep_merge(base: dict, override: dict | None) -> dict:
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if key == "model" and isinstance(value, dict) and value.get("family", (out.get(key) or {}).get("family")) != (out.get(key) or {}).get("family"):
            out[key] = copy.deepcopy(value)  # another model family: its keys replace the old family's
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


PROTOCOLS = ("clean", "paper")
