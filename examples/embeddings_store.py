"""Embeddings into the gpuopt vector store, then a filtered nearest-neighbour query.

Runs on a CPU (numpy embeddings from a fixed random projection of bag-of-words counts). With
``--torch`` the embeddings come from a small torch model instead, on CUDA when there is a GPU, and
go into the store as tensors (CUDA rows through the device-pointer ingest).

    python examples/embeddings_store.py [--torch] [--store DIR]
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

import gpuopt.vector

DOCUMENTS = [
    ("the gpu link trained at gen4 instead of gen5", "hardware", 2024),
    ("pcie replay counters climb under load", "hardware", 2023),
    ("int4 weights halve the memory of a linear layer", "models", 2024),
    ("green contexts give a stream its own sms", "runtime", 2025),
    ("a priority stream still waits for busy sms", "runtime", 2022),
    ("gptq checkpoints store zeros minus one", "models", 2023),
    ("the vector store commits each batch before it answers", "storage", 2025),
    ("sqlite wal mode with full synchronous writes", "storage", 2021),
]
DIM = 64


def vocabulary() -> dict[str, int]:
    words = sorted({w for text, _, _ in DOCUMENTS for w in text.split()})
    return {w: i for i, w in enumerate(words)}


def bag_of_words(texts: list[str], vocab: dict[str, int]) -> np.ndarray:
    counts = np.zeros((len(texts), len(vocab)), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in text.split():
            if word in vocab:
                counts[row, vocab[word]] += 1
    return counts


def embed_numpy(texts: list[str], vocab: dict[str, int]) -> np.ndarray:
    projection = np.random.default_rng(0).standard_normal((len(vocab), DIM)).astype(np.float32)
    return bag_of_words(texts, vocab) @ projection


def embed_torch(texts: list[str], vocab: dict[str, int]):
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(len(vocab), 128), torch.nn.Tanh(), torch.nn.Linear(128, DIM)
    )
    model = model.to(device).eval()
    with torch.no_grad():
        return model(torch.from_numpy(bag_of_words(texts, vocab)).to(device)).contiguous()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", action="store_true", help="embed with a torch model")
    parser.add_argument("--store", help="store directory (default: a temporary one)")
    args = parser.parse_args()
    vocab = vocabulary()
    embed = embed_torch if args.torch else embed_numpy
    with tempfile.TemporaryDirectory() as scratch:
        with gpuopt.vector.open(args.store or f"{scratch}/store", create=True) as store:
            docs = store.get_or_create_collection("docs", dim=DIM, metric="cosine")
            texts = [text for text, _, _ in DOCUMENTS]
            metadata = [{"topic": topic, "year": year} for _, topic, year in DOCUMENTS]
            ids = docs.add(embed(texts, vocab), metadata=metadata)
            print(f"added {len(ids)} documents; the collection holds {docs.count}")
            question = ["which sms does a stream get"]
            where = {
                "$and": [{"topic": {"$in": ["runtime", "hardware"]}}, {"year": {"$gte": 2023}}]
            }
            hit_ids, distances = docs.query(embed(question, vocab), k=3, where=where)
            print(f"query {question[0]!r} where {where}:")
            for doc_id, distance in zip(hit_ids[0].tolist(), distances[0].tolist()):
                if doc_id < 0:
                    continue
                text, topic, year = DOCUMENTS[doc_id - int(ids[0])]
                print(f"  {distance:.3f}  [{topic} {year}] {text}")


if __name__ == "__main__":
    main()
