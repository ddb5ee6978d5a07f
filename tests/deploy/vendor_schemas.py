"""Rebuild tests/deploy/schemas/ from the registry packages that ship the schemas (run by hand, offline
afterwards; the tests only read the vendored files).

    python -m tests.deploy.vendor_schemas DCLINT_PACKAGE_DIR KUBERNETES_VALIDATE_PACKAGE_DIR

- Compose: `schemas/compose.schema.json` of the npm package `dclint` (the Compose Specification's
  JSON schema, compose-spec/compose-spec, Apache-2.0, as redistributed by dclint under MIT).
  Get it with `npm pack dclint@3.1.0` and untar.
- Kubernetes: `kubernetes-json-schema/<version>-local-strict/` of the PyPI package
  `kubernetes-validate` (Apache-2.0; generated from the Kubernetes OpenAPI, Apache-2.0). Get it with
  `pip download kubernetes-validate==1.37.0 --no-deps` and unzip. Only the kinds in KINDS are kept,
  and `_definitions.json` is pruned to the definitions those kinds reach (the full file is 1.5 MB).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "schemas"
KUBERNETES_VERSION = "v1.34.0"
KINDS = ("deployment-apps-v1", "service-v1", "poddisruptionbudget-policy-v1")
DEFS_PREFIX = "/api/_definitions.json#/$defs/"


def refs(node: Any) -> set[str]:
    """Every definition name referenced anywhere under `node`."""
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and "#/$defs/" in ref:
            found.add(ref.split("#/$defs/", 1)[1])
        for value in node.values():
            found |= refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= refs(value)
    return found


def main(dclint_dir: Path, kv_dir: Path) -> None:
    HERE.mkdir(exist_ok=True)
    compose = json.loads((dclint_dir / "schemas" / "compose.schema.json").read_text())
    (HERE / "compose-spec.json").write_text(json.dumps(compose, indent=1) + "\n")

    source = kv_dir / "kubernetes-json-schema" / f"{KUBERNETES_VERSION}-local-strict"
    definitions = json.loads((source / "_definitions.json").read_text())
    out = HERE / f"kubernetes-{KUBERNETES_VERSION}-strict"
    out.mkdir(exist_ok=True)
    wanted: set[str] = set()
    for kind in KINDS:
        schema = json.loads((source / f"{kind}.json").read_text())
        (out / f"{kind}.json").write_text(json.dumps(schema, indent=1) + "\n")
        wanted |= refs(schema)
    todo = list(wanted)
    while todo:
        for name in refs(definitions["$defs"][todo.pop()]) - wanted:
            wanted.add(name)
            todo.append(name)
    pruned = {k: v for k, v in definitions.items() if k != "$defs"}
    pruned["$defs"] = {k: definitions["$defs"][k] for k in sorted(wanted)}
    (out / "_definitions.json").write_text(json.dumps(pruned, indent=1) + "\n")
    print(f"compose schema + {len(KINDS)} Kubernetes kinds, {len(wanted)} definitions -> {HERE}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
