"""Reading a measured profile (``--profile PATH``, written by ``meshplan calibrate``)."""

from __future__ import annotations

from pathlib import Path

from meshplan.errors import MeshplanError
from meshplan.io.files import parse_json, parse_yaml, read_text
from meshplan.specs.base import build
from meshplan.specs.profile import Profile


def load_profile(path: str | Path | Profile | dict) -> Profile:
    """A Profile from a YAML/JSON file (or a mapping); a bad field is one error naming it."""
    if isinstance(path, Profile):
        return path
    if not isinstance(path, (str, Path, dict)):
        raise MeshplanError("--profile", path, "a profile file's path (meshplan calibrate writes one), or a mapping")
    where = "profile" if isinstance(path, dict) else str(path)
    if isinstance(path, dict):
        data = path
    else:
        text = read_text(path, "--profile")
        data = parse_json(text, where) if str(path).endswith(".json") else parse_yaml(text, where)
    if not isinstance(data, dict):
        raise MeshplanError(where, type(data).__name__, "a profile is a mapping with efficiency: (and device:, network:), as `meshplan calibrate` writes")
    try:
        return build(Profile, data, "")
    except MeshplanError as err:
        raise MeshplanError(f"{where}: {err.field}", err.value, err.valid, hint=err.hint) from None
