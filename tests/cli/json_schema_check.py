#!/usr/bin/env python3
"""Validates JSON documents against gpuopt's schemas (docs/schemas) with python3-jsonschema.
    json_schema_check.py SCHEMA_DIR --check-schemas
    json_schema_check.py SCHEMA_DIR SCHEMA_FILE DOCUMENT [--lines] [--expect-invalid]
--lines validates each line of DOCUMENT as its own document (JSON lines); --expect-invalid passes
only when validation fails, to show a schema can catch a change. Exit 0 on success, 1 on a
mismatch (every error printed), 77 when jsonschema is not installed."""
import json
import os
import sys

try:
    import jsonschema
except ImportError:
    print("SKIP: python3-jsonschema is not installed (scripts/setup.sh installs it)")
    sys.exit(77)


def load_schemas(directory):
    schemas = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".schema.json"):
            with open(os.path.join(directory, name)) as f:
                schemas[name] = json.load(f)
    return schemas


def validator_for(schemas, name):
    schema = schemas[name]
    cls = jsonschema.Draft202012Validator
    try:  # jsonschema >= 4.18: the referencing library resolves "bench.schema.json" etc.
        from referencing import Registry, Resource
        registry = Registry().with_resources(
            (s["$id"], Resource.from_contents(s)) for s in schemas.values())
        return cls(schema, registry=registry)
    except ImportError:
        # Older jsonschema (Debian 12 ships 4.10) joins nested relative $ids onto each other:
        # resolve by file name instead, with the $ids left out.
        store = {key: {k: v for k, v in s.items() if k != "$id"} for key, s in schemas.items()}
        resolver = jsonschema.RefResolver(base_uri=name, referrer=store[name], store=store)
        return cls(store[name], resolver=resolver)


def main(argv):
    directory = argv[1]
    schemas = load_schemas(directory)
    if argv[2] == "--check-schemas":
        for name, schema in schemas.items():
            jsonschema.Draft202012Validator.check_schema(schema)
            assert schema.get("$id") == "gpuopt/" + name, f"{name}: $id must be gpuopt/{name}"
        print(f"{len(schemas)} schemas are valid JSON Schema 2020-12")
        return 0
    name, path = argv[2], argv[3]
    lines = "--lines" in argv
    expect_invalid = "--expect-invalid" in argv
    validator = validator_for(schemas, name)
    with open(path) as f:
        text = f.read()
    try:
        documents = [json.loads(line) for line in text.splitlines() if line.strip()] if lines \
            else [json.loads(text)]
    except json.JSONDecodeError as error:
        print(f"FAIL: {path} is not JSON: {error}")
        return 1
    if not documents:
        print(f"FAIL: {path} holds no JSON document")
        return 1
    errors = []
    for index, document in enumerate(documents):
        for error in validator.iter_errors(document):
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            errors.append(f"{path}{f' line {index + 1}' if lines else ''}: {where}: {error.message}")
    if expect_invalid:
        if errors:
            return 0
        print(f"FAIL: {path} was expected to break {name} but validates")
        return 1
    for error in errors[:20]:
        print("FAIL:", error[:400])
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
