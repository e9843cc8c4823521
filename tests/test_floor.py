"""The floor (``python -m kratos_admit.webhook.floor``): allow with the uid echoed; with
``--patch-annotation``, the least patch a mutating webhook can answer with."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from typing import Any

import jsonpatch
import pytest
from aiohttp.test_utils import TestClient, TestServer

from kratos_admit.admission.request import admission_review
from kratos_admit.webhook.floor import create_app
from tests.builders import make_job


async def answer(app: Any, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    async with TestClient(TestServer(app)) as client:
        response = await client.post(path, json=admission_review(obj, uid="u-7"))
        assert response.status == 200
        body: dict[str, Any] = (await response.json())["response"]
        return body


async def test_the_floor_allows_and_echoes_the_uid_without_a_patch():
    assert await answer(create_app(), "/mutate", make_job("a").obj()) == {"uid": "u-7", "allowed": True}


@pytest.mark.parametrize("annotated", [False, True])
async def test_a_patching_floor_sets_one_annotation_whether_the_object_has_annotations_or_not(
    annotated: bool,
):
    job = make_job("a").obj()
    job["metadata"].pop("annotations", None)
    if annotated:
        job["metadata"]["annotations"] = {"team": "a"}
    response = await answer(create_app(("kratos.test/floor", "x/y")), "/mutate", job)
    assert response["patchType"] == "JSONPatch" and response["allowed"] is True
    patched = jsonpatch.apply_patch(job, json.loads(base64.b64decode(response["patch"])))
    assert patched["metadata"]["annotations"] == {
        **({"team": "a"} if annotated else {}),
        "kratos.test/floor": "x/y",
    }
    assert await answer(create_app(("kratos.test/floor", "x")), "/validate", job) == {
        "uid": "u-7",
        "allowed": True,
    }


def test_a_patch_annotation_without_a_value_is_a_usage_error():
    done = subprocess.run(
        [sys.executable, "-m", "kratos_admit.webhook.floor", "--listen", "127.0.0.1:0", "--tls-cert", "c",
         "--tls-key", "k", "--patch-annotation", "novalue"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "--patch-annotation: want KEY=VALUE, got 'novalue'" in done.stderr
