"""The `--config` YAML file read strictly: UTF-8 text (else one line naming the file and the byte, probe
N42: a UnicodeDecodeError traceback), and each key once (a key given twice silently took the last value,
N43; so does a flag spelled two ways, `num-rollout` and `num_rollout`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class DuplicateKey(ValueError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a mapping naming one key twice (merge keys `<<` are YAML's own override)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader's own error says so below
                    continue
                if first is not None:
                    raise DuplicateKey(f"gives the key {key!r} twice (lines {first} and {line})")
                seen[key] = line
        return super().construct_mapping(node, deep)


def read_config_file(path: Path) -> Any:
    """The YAML value of the file at `path`. ValueError (with the reason) for bytes that are not UTF-8,
    YAML that does not parse, or a key given twice."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"is not UTF-8 text (byte {exc.start}: {exc.object[exc.start:exc.start + 1]!r})") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:  # its message spans lines (the mark and a caret): one line here
        raise ValueError(f"is not valid YAML: {' '.join(str(exc).split())[:300]}") from None


def flag_keys(data: dict) -> dict[str, Any]:
    """The file's keys as flag field names (`--num-rollout`, `num-rollout` -> `num_rollout`); ValueError
    when two spellings name one flag."""
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in data.items():
        name = str(key).lstrip("-").replace("-", "_")
        if name in out:
            raise ValueError(f"gives {spelled[name]!r} and {key!r}, which name one flag (--{name.replace('_', '-')}); "
                             f"give it once")
        out[name], spelled[name] = value, str(key)
    return out
