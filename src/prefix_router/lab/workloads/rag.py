"""RAG / long documents: a few long shared documents, each request asks a different question about one.

The prompt puts the document before the question, so requests on the same document share it whole.
Document lengths are ``document_tokens`` each, or drawn uniformly (seeded) between ``document_tokens`` and
``document_tokens_max`` when that is set (long-document RAG: e.g. 30,000 to 120,000 tokens).
"""

from __future__ import annotations

import random

from prefix_router.lab.workloads.chatbots import zipf_weights
from prefix_router.lab.workloads.settings import WorkloadSettings
from prefix_router.lab.workloads.text import random_text, rng_for, tagged_text
from prefix_router.lab.workloads.types import Session, Turn

SYSTEM_PROMPT = "Answer the question using only the document. Quote the relevant passage."


class RagSettings(WorkloadSettings):
    documents: int = 4
    document_tokens: int = 4096
    document_tokens_max: int | None = None  # lengths drawn in [document_tokens, document_tokens_max]
    zipf_s: float = 0.0  # document popularity; 0 = uniform
    question_tokens: int = 32
    output_tokens: int = 48


def build(opts: RagSettings, requests: int, seed: int) -> list[Session]:
    if opts.documents < 1:
        raise ValueError("documents must be >= 1")
    top = opts.document_tokens_max
    if top is not None and top < opts.document_tokens:
        raise ValueError("document_tokens_max must be >= document_tokens")
    sizes = random.Random(f"rag-sizes:{seed}")
    lengths = [opts.document_tokens if top is None else sizes.randint(opts.document_tokens, top)
               for _ in range(opts.documents)]  # fmt: skip
    docs = [tagged_text(f"document {d}", rng_for("rag", seed, d), n) for d, n in enumerate(lengths)]
    rng = random.Random(f"rag-requests:{seed}")
    picks = rng.choices(range(opts.documents), weights=zipf_weights(opts.documents, opts.zipf_s), k=requests)
    return [_session(i, d, docs[d], opts, rng) for i, d in enumerate(picks)]


def _session(index: int, doc_index: int, document: str, opts: RagSettings, rng: random.Random) -> Session:
    question = f"Question {index}: {random_text(rng, opts.question_tokens)}?"
    content = f"<document id={doc_index}>\n{document}\n</document>\n\n{question}"
    turn = Turn(max_tokens=opts.output_tokens, messages=({"role": "user", "content": content},))
    preamble = ({"role": "system", "content": SYSTEM_PROMPT},)
    return Session(session_id=f"rag-{index}", arrival_s=0.0, turns=(turn,), preamble=preamble)
