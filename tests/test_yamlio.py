"""kratos_admit.domain.yamlio reads and writes exactly what PyYAML's safe functions do, only faster."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from kratos_admit.cli.main import main
from kratos_admit.domain import yamlio
from tests.harness import EXAMPLES, FIXTURES

TRICKY = {
    "numbers-bools-null-dates": "i: 0x1f\nf: 1.5e3\nb: yes\nn: ~\nd: 2001-12-14\ns: '123'\nlist: [1, '2', on]\n",
    "merge-key": "base: &b {x: 1}\nderived: {<<: *b, y: 2}\n",
    "explicit-tags": "bin: !!binary aGVsbG8=\nset: !!set {a, b}\nstr: !!str 12\n",
    "shared-alias": "a: &x {k: v}\nb: *x\nc: *x\n",
    "recursive-alias": "r: &r [1, *r]\n",
    "recursive-mapping": "m: &m {self: *m}\n",
    "unicode-and-multiline": 'name: "h\\u00e9\\nllo"\nblock: |\n  line one\n  line two\n',
    "empty-documents": "---\n---\na: 1\n...\n---\n",
}


def texts() -> list[tuple[str, str]]:
    found = [(p.name, p.read_text()) for p in sorted(EXAMPLES.rglob("*.yaml"))]
    if FIXTURES.is_dir():
        found += [(p.name, p.read_text()) for p in sorted((FIXTURES / "manifests").glob("*.yaml"))]
    return found + sorted(TRICKY.items())


@pytest.mark.parametrize(("name", "text"), texts(), ids=[n for n, _ in texts()])
def test_loading_gives_what_safe_load_all_gives(name: str, text: str):
    expected = list(yaml.safe_load_all(text))
    assert repr(list(yamlio.load_all(text))) == repr(expected)  # repr: recursive values compare too


def test_an_alias_is_the_same_object_as_pyyaml_makes_it():
    [doc] = yamlio.load_all(TRICKY["shared-alias"])
    assert doc["a"] is doc["b"] is doc["c"]


@pytest.mark.parametrize(
    "text", ["a: [\n", "a: b\n c: d\n", "{[1]: x}\n"], ids=["unclosed", "indent", "unhashable-key"]
)
def test_a_bad_document_is_refused_as_pyyaml_refuses_it(text: str):
    with pytest.raises(yaml.YAMLError) as ours:
        list(yamlio.load_all(text))
    with pytest.raises(yaml.YAMLError) as theirs:
        list(yaml.safe_load_all(text))
    assert type(ours.value) is type(theirs.value)


def reviewed_objects() -> list[object]:
    out = io.StringIO()
    # the manifests under examples/ (not -R: examples/simulation/ holds the simulator's trace and
    # truth files, which are no Kubernetes objects)
    main(["review", "-f", str(EXAMPLES), "-f", str(EXAMPLES / "profiles"), "--profiles", str(EXAMPLES / "profiles"),
          "--nodes", str(EXAMPLES / "nodes.yaml"), "-o", "json"], stdout=out, stderr=io.StringIO())  # fmt: skip
    return [r["object"] for r in json.loads(out.getvalue())]


@pytest.mark.parametrize("source", ["documents", "reviewed"])
def test_writing_gives_byte_for_byte_what_safe_dump_gives(source: str):
    docs = (
        [d for _, text in texts()[: -len(TRICKY)] for d in yaml.safe_load_all(text) if d is not None]
        if source == "documents"
        else reviewed_objects()
    )
    assert docs
    for doc in docs:
        assert yamlio.dump(doc) == yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    out = io.StringIO()
    writer = yamlio.DocumentWriter(out)
    for doc in docs:
        writer.write(doc)
    writer.close()
    assert out.getvalue() == yaml.safe_dump_all(docs, sort_keys=False, allow_unicode=True)


def test_a_value_that_repeats_is_written_in_full_not_as_an_anchor():
    shared = {"key": "value"}
    assert yamlio.dump({"a": shared, "b": shared}) == "a:\n  key: value\nb:\n  key: value\n"


def test_a_manifest_with_a_recursive_alias_is_no_object_to_review(tmp_path: Path):
    manifest = tmp_path / "r.yaml"
    manifest.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: r}\ndata: &d {self: *d}\n")
    err = io.StringIO()
    assert main(["review", "-f", str(manifest)], stdout=io.StringIO(), stderr=err) == 2
    assert "document 1: cannot be sent to the API server as JSON" in err.getvalue()
