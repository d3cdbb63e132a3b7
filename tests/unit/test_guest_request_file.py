"""YAML request files: guests in order, base XML relative to the file, every problem named."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmplacer.adapters.request_file import RequestFileError, load_request_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "requests"


def write(tmp_path: Path, text: str, name: str = "guests.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_example_request_file_loads_in_order():
    requests = load_request_file(EXAMPLES / "mixed.yaml")
    assert [r.index for r in requests] == list(range(len(requests)))
    assert requests[0].spec.name == "db1" and requests[0].spec.latency_critical
    web = next(r for r in requests if r.spec.name == "web1")
    assert web.spec.cpu_policy == "dedicated" and web.spec.numa_nodes == 1  # from extra_specs


def test_base_xml_is_read_relative_to_the_request_file(tmp_path):
    (tmp_path / "xml").mkdir()
    (tmp_path / "xml" / "web1.xml").write_text("<domain type='kvm'><name>web1</name></domain>")
    path = write(tmp_path, "guests:\n  - {name: web1, vcpus: 1, memory_mib: 512, base_xml: xml/web1.xml}\n")
    (request,) = load_request_file(path)
    assert request.base_xml.startswith("<domain") and request.base_xml_path == tmp_path / "xml" / "web1.xml"


def test_every_problem_names_file_guest_field_and_reason(tmp_path):
    path = write(tmp_path, """
guests:
  - name: db1
    vcpus: x
    memory_mib: 1024
  - name: db1
    vcpus: 1
    memory_mib: 1024
  - name: web1
    vcpus: 1
    memory_mib: 512
    base_xml: missing.xml
  - vcpus: 2
    memory_mib: 512
    colour: red
""")
    with pytest.raises(RequestFileError) as caught:
        load_request_file(path)
    lines = str(caught.value).splitlines()
    assert f"{path}: guest #0 (db1): field vcpus: must be an integer 1..1024, got 'x'" in lines
    assert f"{path}: guest #1 (db1): field name: 'db1' is already used by guest #0" in lines
    assert any(line.startswith(f"{path}: guest #2 (web1): field base_xml: file ") and "not found" in line
               for line in lines)
    assert f"{path}: guest #3: field name: is required" in lines
    assert any(line.startswith(f"{path}: guest #3: field colour: unknown field") for line in lines)


def test_duplicate_names_are_refused(tmp_path):
    path = write(tmp_path, "guests:\n  - {name: a, vcpus: 1, memory_mib: 1}\n  - {name: a, vcpus: 1, memory_mib: 1}\n")
    with pytest.raises(RequestFileError, match=r"guest #1 \(a\): field name: 'a' is already used by guest #0"):
        load_request_file(path)


@pytest.mark.parametrize("text, fragment", [
    ("guests: [\n", "invalid YAML"),
    ("- a\n- b\n", "must be a mapping with a 'guests' list"),
    ("guests: []\n", "non-empty list"),
    ("guests:\n  - {name: a, vcpus: 1, memory_mib: 1}\nextra: 1\n", "unknown top-level key 'extra'"),
    ("guests:\n  - {name: a, name: b, vcpus: 1, memory_mib: 1}\n", "duplicate key 'name'"),
    ("guests:\n  - !!python/object/apply:os.system ['true']\n", "invalid YAML"),
    ("guests:\n  - just-a-string\n", "guest #0: must be a mapping"),
])
def test_malformed_files(tmp_path, text, fragment):
    with pytest.raises(RequestFileError, match=fragment):
        load_request_file(write(tmp_path, text))


def test_base_xml_must_be_a_domain(tmp_path):
    (tmp_path / "net.xml").write_text("<network/>")
    (tmp_path / "bad.xml").write_text("<domain>")
    path = write(tmp_path, "guests:\n  - {name: a, vcpus: 1, memory_mib: 1, base_xml: net.xml}\n"
                           "  - {name: b, vcpus: 1, memory_mib: 1, base_xml: bad.xml}\n")
    with pytest.raises(RequestFileError) as caught:
        load_request_file(path)
    text = str(caught.value)
    assert "guest #0 (a): field base_xml:" in text and "expected <domain>" in text
    assert "guest #1 (b): field base_xml:" in text and "not well-formed" in text


def test_missing_file(tmp_path):
    with pytest.raises(RequestFileError, match="file not found"):
        load_request_file(tmp_path / "nope.yaml")


# ----- parse errors name the file and the line, not the parser's "<unicode string>" ----------

def test_yaml_syntax_error_names_the_file_and_line(tmp_path):
    path = write(tmp_path, "guests:\n  - name: [a\n")
    with pytest.raises(RequestFileError) as caught:
        load_request_file(path)
    (line,) = str(caught.value).splitlines()
    assert line.startswith(f"{path}: invalid YAML at line 3, column 1: ")
    assert "while parsing a flow sequence from line 2" in line and "<unicode string>" not in line


def test_every_duplicate_key_is_named_with_both_lines(tmp_path):
    path = write(tmp_path, "guests:\n  - name: a\n    vcpus: 1\n    name: b\n    memory_mib: 1\n    vcpus: 2\n")
    with pytest.raises(RequestFileError) as caught:
        load_request_file(path)
    assert caught.value.problems == ("line 4, column 5: duplicate key 'name' (first at line 2)",
                                     "line 6, column 5: duplicate key 'vcpus' (first at line 3)")
    assert str(caught.value).startswith(f"{path}: line 4")


def test_base_xml_syntax_error_names_the_xml_file_and_line(tmp_path):
    (tmp_path / "bad.xml").write_text("<domain>\n  <name>x</nam>\n</domain>\n")
    path = write(tmp_path, "guests:\n  - {name: a, vcpus: 1, memory_mib: 1, base_xml: bad.xml}\n")
    with pytest.raises(RequestFileError) as caught:
        load_request_file(path)
    text = str(caught.value)
    assert f"field base_xml: {tmp_path / 'bad.xml'}: not well-formed XML at line 2, column 16: " in text
    assert "(<string>" not in text
