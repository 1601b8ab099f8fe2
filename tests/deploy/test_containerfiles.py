"""The image definitions agree on what the KServe runtime and the tests rely on: two
stages, a non-root user, the entry point copied where the exec-form ENTRYPOINT runs it,
and a build context (.dockerignore) that admits every file they copy."""

from __future__ import annotations

import fnmatch
import json
import re

import pytest
from deploy_files import DEPLOY, ROOT, RUNTIME, container, manifest  # noqa: I001

FILES = ["Containerfile", "Containerfile.jetson"]


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^([A-Za-z]+)\s+(.*)$", joined, re.MULTILINE)
            if not m.group(0).lstrip().startswith("#")]


@pytest.mark.parametrize("name", FILES)
def test_two_stages_a_non_root_user_and_the_entry_point(name: str) -> None:
    steps = _instructions((DEPLOY / name).read_text())
    assert sum(kind == "FROM" for kind, _ in steps) == 2 and " AS build" in next(a for k, a in steps if k == "FROM")
    final = steps[max(i for i, (kind, _) in enumerate(steps) if kind == "FROM"):]
    (user,) = [a for k, a in final if k == "USER"]
    assert user.split(":")[0] == "10001"  # numeric: Kubernetes' runAsNonRoot checks it without /etc/passwd
    assert str(container(manifest(RUNTIME))["securityContext"]["runAsUser"]) == user.split(":")[0]
    (entry,) = [json.loads(a) for k, a in final if k == "ENTRYPOINT"]  # exec form: no shell between
    assert entry == ["/opt/layerfit/bin/python", "/opt/layerfit/entrypoint.py"]
    assert ("COPY", "deploy/entrypoint.py /opt/layerfit/entrypoint.py") in final


def _admitted(path: str, rules: list[str]) -> bool:
    """Whether .dockerignore lets ``path`` into the build context (the last matching rule wins)."""
    admitted = True
    for rule in rules:
        negated = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            admitted = negated
    return admitted


@pytest.mark.parametrize("name", FILES)
def test_the_build_context_holds_what_is_copied(name: str) -> None:
    rules = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert not _admitted(".venv/bin/python", rules) and not _admitted("build/site/index.html", rules)
    for kind, arguments in _instructions((DEPLOY / name).read_text()):
        if kind == "COPY" and not arguments.startswith("--from"):
            *sources, _ = arguments.split()
            for source in sources:
                assert (ROOT / source).exists(), source
                probe = source if (ROOT / source).is_file() else f"{source}/layerfit/__init__.py"
                assert _admitted(probe, rules), source
