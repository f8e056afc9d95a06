"""Model-family presets, written in the policy file's own schema.

A policy entry names a preset and overrides what differs (typically ``max_tokens``
to match the upstream's ``--max-model-len``). Prompt formats follow each model
card; see upstream-behaviour.md's prefix table.
"""

from __future__ import annotations

from typing import Any, Final

QWEN3_TASK: Final = "Given a web search query, retrieve relevant passages that answer the query"
QWEN3_EOS: Final = 151643


def _qwen3(hf_id: str, native: int) -> dict[str, Any]:
    return {
        "tokenizer": {"hf_id": hf_id, "special_tokens": {"append_ids": [QWEN3_EOS]}},
        "max_tokens": 32768,
        # No space after "Query:" - the model card's format, and what gives the
        # seed's 28 tokens for "What is the capital city of France?".
        "prompts": {
            "query": "Instruct: {instruction}\nQuery:{text}",
            "document": "{text}",
            "default_instruction": QWEN3_TASK,
        },
        "native_dimensions": native,
        "matryoshka": {"min_dimensions": 32},
        "encoding_profile": "OPENAI",
        "upstream_flavour": "DYNAMO",
    }


def _from_tokenizer(hf_id: str) -> dict[str, Any]:
    return {"hf_id": hf_id, "special_tokens": {"from_tokenizer": True}}


PRESETS: Final[dict[str, dict[str, Any]]] = {
    "qwen3-embedding-0.6b": _qwen3("Qwen/Qwen3-Embedding-0.6B", 1024),
    "qwen3-embedding-4b": _qwen3("Qwen/Qwen3-Embedding-4B", 2560),
    "qwen3-embedding-8b": _qwen3("Qwen/Qwen3-Embedding-8B", 4096),
    "e5": {  # multilingual-e5-large (and e5-*-v2): query/passage prefixes
        "tokenizer": _from_tokenizer("intfloat/multilingual-e5-large"),
        "max_tokens": 512,
        "prompts": {"query": "query: {text}", "document": "passage: {text}"},
        "native_dimensions": 1024,
        "encoding_profile": "OPENAI",
        "upstream_flavour": "DYNAMO",
    },
    "bge": {  # bge-large-en-v1.5: instruction on queries only
        "tokenizer": _from_tokenizer("BAAI/bge-large-en-v1.5"),
        "max_tokens": 512,
        "prompts": {
            "query": "Represent this sentence for searching relevant passages: {text}",
            "document": "{text}",
        },
        "native_dimensions": 1024,
        "encoding_profile": "OPENAI",
        "upstream_flavour": "DYNAMO",
    },
    "nomic": {  # nomic-embed-text-v1.5: task prefixes, Matryoshka 64..768
        "tokenizer": _from_tokenizer("nomic-ai/nomic-embed-text-v1.5"),
        "max_tokens": 8192,
        "prompts": {
            "query": "search_query: {text}",
            "document": "search_document: {text}",
            "extra": {
                "classification": "classification: {text}",
                "clustering": "clustering: {text}",
            },
        },
        "native_dimensions": 768,
        "matryoshka": {"min_dimensions": 64},
        "encoding_profile": "OPENAI",
        "upstream_flavour": "DYNAMO",
    },
    "embeddinggemma": {  # embeddinggemma-300m: MRL at 768/512/256/128
        "tokenizer": _from_tokenizer("google/embeddinggemma-300m"),
        "max_tokens": 2048,
        "prompts": {
            "query": "task: search result | query: {text}",
            "document": "title: none | text: {text}",
        },
        "native_dimensions": 768,
        "matryoshka": {"allowed": [128, 256, 512, 768]},
        "encoding_profile": "OPENAI",
        "upstream_flavour": "DYNAMO",
    },
    "all-minilm-l6-v2": {  # sentence-transformers/all-MiniLM-L6-v2: no prompts
        "tokenizer": _from_tokenizer("sentence-transformers/all-MiniLM-L6-v2"),
        "max_tokens": 256,
        "native_dimensions": 384,
        "encoding_profile": "OPENAI",
        "upstream_flavour": "DYNAMO",
    },
    "plain": {  # no prompts; name the tokenizer and sizes yourself
        "encoding_profile": "OPENAI",
        "upstream_flavour": "DYNAMO",
    },
}
