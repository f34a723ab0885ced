"""The encoder example (examples/encoder) deployed on the embedded stack: its scores
are those of ``from_pretrained`` on the same files, for the same text."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from tests.e2e.conftest import E2EStore, running_stack
from tests.e2e.stack import Stack
from tests.fixtures.models import build_bert_classifier

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "encoder"
TEXTS = ["a cold start is fast", "the model is good", "bad"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bert_classifier(tmp_path_factory.mktemp("encoder") / "model")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("encoder-e2e")
    registry = Registry(LocalStore(tmp / "store"))
    spec = tomllib.loads((EXAMPLE / "thaw.toml").read_text())
    push_directory(model_dir, spec["model"], registry)
    bundle = push_directory(EXAMPLE, "bundles/encoder:v1", registry, kind=ArtifactKind.BUNDLE)
    store = E2EStore(root=tmp / "store", bundle=bundle.digest, model=spec["model"])
    with running_stack("embedded", tmp, store) as s:
        s.deploy({**spec, "bundle": bundle.digest, "device": "cpu"})
        yield s


def invoke(stack: Stack, body: dict[str, Any]) -> Any:
    with stack.client() as c:
        r = c.post("/v1/functions/encoder/invoke", json={"input": body})
    assert r.status_code == 200, f"{r.status_code} {r.text}\n{stack.logs()}"
    return r.json()["output"]


def reference_scores(model_dir: Path, texts: list[str]) -> list[list[float]]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logits = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits
    return torch.softmax(logits, dim=-1).tolist()


def test_scores_equal_from_pretrained_on_the_same_model(stack: Stack, model_dir: Path) -> None:
    labels = ["label_0", "label_1", "label_2"]
    for text in TEXTS:
        out = invoke(stack, {"text": text})
        [want] = reference_scores(model_dir, [text])
        assert list(out["scores"]) == labels
        assert list(out["scores"].values()) == pytest.approx(want, rel=1e-5, abs=1e-6)
        assert out["label"] == labels[max(range(3), key=want.__getitem__)]
    # The same input again: the same answer (no buffer left unset between calls).
    assert invoke(stack, {"text": TEXTS[0]}) == invoke(stack, {"text": TEXTS[0]})


def test_a_batch_of_texts_scores_each(stack: Stack, model_dir: Path) -> None:
    rows = invoke(stack, {"texts": TEXTS})
    want = reference_scores(model_dir, TEXTS)
    assert len(rows) == len(TEXTS)
    for row, expected in zip(rows, want, strict=True):
        assert list(row["scores"].values()) == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_readme_shows_the_example_verbatim() -> None:
    readme = (EXAMPLE.parents[1] / "README.md").read_text()
    app = (EXAMPLE / "app.py").read_text()
    assert (EXAMPLE / "thaw.toml").read_text().strip() in readme
    assert app[app.index("from __future__ import annotations") :].strip() in readme
