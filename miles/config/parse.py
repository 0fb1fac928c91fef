"""Fill config sections from Miles-style CLI flags and/or a YAML file (the flag wins).

Each section is a frozen dataclass whose fields are declared with `fields.flag`. The
parser reads every value as text, then converts and checks it with one code path for
flags and YAML alike, so an error reads the same wherever the bad value came from.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, Iterable

from miles.config.fields import ConfigError, flag_name
from miles.config.yaml_file import flag_keys, read_config_file

CONFIG_FLAG = "--config"


def section_fields(section: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(section)
    return [(f, hints[f.name]) for f in dataclasses.fields(section)]


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def _type_label(tp: Any) -> str:
    base, optional = _unwrap_optional(tp)
    if typing.get_origin(base) is list:
        label = f"list of {typing.get_args(base)[0].__name__}"
    else:
        label = getattr(base, "__name__", str(base))
    return label + (" or none" if optional else "")


def convert(field: dataclasses.Field, tp: Any, raw: Any) -> Any:
    """Turn a flag's text (or a YAML value) into the field's type, or raise ConfigError."""
    name = flag_name(field.name)
    base, optional = _unwrap_optional(tp)
    if raw is None or (optional and isinstance(raw, str) and raw.lower() in ("none", "null", "")):
        if optional:
            return None
        raise ConfigError(name, f"a value is required ({_type_label(tp)})")
    if typing.get_origin(base) is list:
        (item_tp,) = typing.get_args(base)
        items = raw if isinstance(raw, (list, tuple)) else [raw]
        return [_convert_scalar(name, item_tp, item) for item in items]
    return _convert_scalar(name, base, raw)


def _convert_scalar(name: str, tp: Any, raw: Any) -> Any:
    if tp is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(name, f"expected true or false, got {raw!r}")
    if tp is int:
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            raise ConfigError(name, f"expected an integer, got {raw!r}")
        try:
            return int(raw) if not isinstance(raw, str) else int(raw.strip(), 0)
        except (TypeError, ValueError, OverflowError):  # a YAML list or mapping, an infinite float
            raise ConfigError(name, f"expected an integer, got {raw!r}") from None
    if tp is float:
        if isinstance(raw, bool):
            raise ConfigError(name, f"expected a number, got {raw!r}")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ConfigError(name, f"expected a number, got {raw!r}") from None
        if not math.isfinite(value):  # NaN passes every `< minimum` check, so it is refused here
            raise ConfigError(name, f"expected a finite number, got {raw!r}")
        return value
    if tp is str:
        if isinstance(raw, (dict, list)):
            raise ConfigError(name, f"expected text, got {raw!r}")
        return str(raw)
    raise TypeError(f"unsupported config type {tp!r} for {name}")


def check_field(field: dataclasses.Field, value: Any) -> None:
    """Checks declared on the field: choices, bounds, paths that must exist."""
    meta = field.metadata
    name = flag_name(field.name)
    values = value if isinstance(value, list) else [value]
    for v in values:
        if v is None:
            continue
        if meta.get("choices") and v not in meta["choices"]:
            allowed = ", ".join(map(str, meta["choices"]))
            raise ConfigError(name, f"{v!r} is not allowed; choose one of: {allowed}")
        if meta.get("minimum") is not None and v < meta["minimum"]:
            raise ConfigError(name, f"must be >= {meta['minimum']}, got {v}")
        if meta.get("maximum") is not None and v > meta["maximum"]:
            raise ConfigError(name, f"must be <= {meta['maximum']}, got {v}")
        if meta.get("existing_path") and v not in meta.get("or_names", ()) \
                and not Path(os.path.expanduser(str(v))).exists():
            names = meta.get("or_names", ())
            also = f" (nor one of the names: {', '.join(names)})" if names else ""
            raise ConfigError(name, f"path does not exist: {v}{also}")


def _help_text(field: dataclasses.Field, base: Any, default: Any) -> str:
    """A flag's help with its default said once: the field's own words when its help names the default
    (`(default: RUN_DIR/checkpoints)`), else the value; a set secret is never shown."""
    text = field.metadata.get("help", "")
    if "default" not in text and not (default is None and "none" in text.lower()):  # "(none: ...)" says it
        shown = "***" if field.metadata.get("secret") and default else default
        text += f" (default: {shown})"
    if base is bool:
        text += f"; --no-{field.name.replace('_', '-')} sets false"
    if field.metadata.get("choices"):
        text += f" [choices: {', '.join(map(str, field.metadata['choices']))}]"
    return text


def build_parser(sections: Iterable[type], prog: str | None = None, description: str | None = None,
                 add_help: bool = True) -> argparse.ArgumentParser:
    """The flags of `sections` (plus --config). The usage line stays one line (the flags are listed below
    it by section); each flag's help states its default once. `add_help=False`: a parser that picks its
    flags out of a command line another parser owns (that one answers --help)."""
    usage = f"{prog or '%(prog)s'} [--config YAML] [--FLAG VALUE ...]"
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False, usage=usage,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, add_help=add_help)
    parser.add_argument(CONFIG_FLAG, dest="__config_file", default=None, metavar="YAML",
                        help="YAML file of flag values (keys are flag names); flags on the command line win")
    for section in sections:
        group = parser.add_argument_group(section.__name__, (section.__doc__ or "").strip().splitlines()[0])
        for field, tp in section_fields(section):
            names = [flag_name(field.name), *field.metadata.get("aliases", ())]
            base, _ = _unwrap_optional(tp)
            default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
            kwargs: dict[str, Any] = dict(dest=field.name, default=argparse.SUPPRESS,
                                          help=_help_text(field, base, default))
            if base is bool:
                kwargs.update(nargs="?", const="true", metavar="BOOL")
                group.add_argument(f"--no-{field.name.replace('_', '-')}", dest=field.name,
                                   action="store_const", const="false", default=argparse.SUPPRESS,
                                   help=argparse.SUPPRESS)  # named in the flag's own help: one line each
            elif typing.get_origin(base) is list:
                kwargs.update(nargs="*", metavar="VALUE")
            else:
                kwargs.update(metavar=_type_label(base).upper().replace(" ", "_"))  # `none` is in the help
            group.add_argument(*names, **kwargs)
    return parser


def load_yaml(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(CONFIG_FLAG, f"YAML file does not exist: {path}")
    try:
        data = read_config_file(p) or {}
        if not isinstance(data, dict):
            raise ValueError("must hold a mapping of flag names to values")
        return flag_keys(data)
    except ValueError as exc:
        raise ConfigError(CONFIG_FLAG, f"{path} {exc}") from None


def parse_sections(sections: list[type], argv: list[str] | None, prog: str | None = None,
                   description: str | None = None) -> dict[type, Any]:
    """Parse argv (plus an optional --config YAML) into one instance per section."""
    parser = build_parser(sections, prog=prog, description=description)
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:
        bad = next((u for u in unknown if u.startswith("-")), unknown[0])
        raise ConfigError(bad, _unknown_message(bad, parser))
    cli = {k: v for k, v in vars(namespace).items() if k != "__config_file"}
    raw: dict[str, Any] = {}
    config_file = getattr(namespace, "__config_file")
    if config_file:
        raw.update(load_yaml(config_file))
    known = {f.name for s in sections for f in dataclasses.fields(s)}
    for key in raw:
        if key not in known:
            raise ConfigError(flag_name(key), _unknown_message(flag_name(key), parser) + f" (in {config_file})")
    raw.update(cli)  # the command line wins over the YAML file
    return {section: build_section(section, raw) for section in sections}


def build_section(section: type, raw: dict[str, Any]) -> Any:
    values = {}
    for field, tp in section_fields(section):
        if field.name in raw:
            values[field.name] = convert(field, tp, raw[field.name])
        elif field.default is not dataclasses.MISSING:
            values[field.name] = field.default
        else:
            values[field.name] = field.default_factory()
        check_field(field, values[field.name])
    instance = section(**values)
    validate = getattr(instance, "validate", None)
    if validate:
        validate()
    return instance


def _unknown_message(bad: str, parser: argparse.ArgumentParser) -> str:
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    close = difflib.get_close_matches(bad.split("=")[0], options, n=3)
    hint = f"; did you mean {' or '.join(close)}?" if close else "; see --help for the flags"
    return f"unknown flag{hint}"
