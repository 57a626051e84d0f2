"""Structured output: every constrained decode of SmolLM2's real vocabulary parses and
validates against its schema; EOS only once the JSON is complete; bad formats are typed
errors; `apply_bitmask` touches only the constrained rows."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.errors import EngineError, InvalidSamplingParams
from dataplane.sampling.grammar import (
    CompiledGrammar,
    GrammarCompiler,
    GrammarError,
    GrammarState,
    InvalidResponseFormat,
    ResponseFormat,
    allocate_bitmask,
    apply_bitmask,
)
from dataplane.tokenizer import Tokenizer

PADDING = 64
"""Logits columns past the tokenizer's vocabulary, as a model with a padded lm_head has."""

TOKEN_CAP = 256
POLICY_SCALES = (1.0, 0.6, 0.6)
"""Decodes per schema, as scales of the `bias` policy: the first must finish within
TOKEN_CAP; the looser ones reach optional and additional members more often."""

SMALL = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def tokenizer(smollm2: Path) -> Tokenizer:
    return Tokenizer.from_dir(smollm2)


@pytest.fixture(scope="module")
def compiler(tokenizer: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler.from_tokenizer(tokenizer, tokenizer.vocab_size + PADDING,
                                          max_threads=2)


@pytest.fixture(scope="module")
def bias(tokenizer: Tokenizer, compiler: GrammarCompiler) -> torch.Tensor:
    """A decoding policy that ends JSON quickly: EOS first, then tokens that close a string,
    object or array; against whitespace-only tokens and commas. Padding ids and special
    tokens get the largest bias of all, so only the mask keeps them out."""
    texts = tokenizer.hf.decode_batch([[i] for i in range(tokenizer.vocab_size)],
                                      skip_special_tokens=False)
    b = torch.zeros(compiler.vocab_size)
    for i, text in enumerate(texts):
        if text and not text.strip():
            b[i] = -3.0
            continue
        b[i] += 3.0 * ('"' in text) + 3.0 * ("}" in text or "]" in text) - 2.5 * ("," in text)
    b[tokenizer.vocab_size:] = 50.0
    for token_id, added in tokenizer.hf.get_added_tokens_decoder().items():
        if added.special:
            b[token_id] = 50.0
    for eos in tokenizer.eos_token_ids:
        b[eos] = 60.0
    return b


def decode(state: GrammarState, bias: torch.Tensor, seed: int, cap: int = TOKEN_CAP
           ) -> list[int]:
    """Random-logits decoding through the mask until termination or `cap` tokens."""
    gen = torch.Generator().manual_seed(seed)
    bitmask = allocate_bitmask(1, bias.numel())
    out: list[int] = []
    while not state.is_terminated() and len(out) < cap:
        state.fill_bitmask(bitmask, 0)
        logits = (torch.randn(bias.numel(), generator=gen) * 2 + bias).unsqueeze(0)
        apply_bitmask(logits, bitmask, [0])
        token = int(logits.argmax())
        assert state.accept(token), token
        out.append(token)
    return out


def output_text(tokenizer: Tokenizer, tokens: list[int]) -> str:
    assert tokens and tokens[-1] in tokenizer.eos_token_ids, "decode did not finish"
    body = tokens[:-1]
    assert not set(body) & tokenizer.eos_token_ids
    return tokenizer.decode(body, skip_special_tokens=False)


def allowed_ids(state: GrammarState) -> set[int]:
    bitmask = allocate_bitmask(1, state.grammar.vocab_size)
    state.fill_bitmask(bitmask, 0)
    bits = (bitmask[0].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1
    return set(bits.flatten().nonzero().flatten().tolist())


# ----- random schemas ---------------------------------------------------------------------------
NAMES = st.text(alphabet='abcdxyz_- "\\é€', min_size=1, max_size=6)
ENUM_VALUES = st.one_of(st.text(alphabet='abc "\\é', max_size=4), st.integers(-50, 50),
                        st.booleans(), st.none())


@st.composite
def string_schemas(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if draw(st.booleans()):
        schema["minLength"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        schema["maxLength"] = draw(st.integers(schema.get("minLength", 0), 12))
    return schema


@st.composite
def integer_schemas(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    if draw(st.booleans()):
        schema["minimum"] = draw(st.integers(-1000, 1000))
    if draw(st.booleans()):
        schema["maximum"] = draw(st.integers(schema.get("minimum", -1000), 2000))
    return schema


@st.composite
def number_schemas(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "number"}
    if draw(st.booleans()):
        schema["minimum"] = draw(st.sampled_from([-10, -1.5, 0, 0.25, 3]))
    if draw(st.booleans()):
        schema["maximum"] = schema.get("minimum", 0) + draw(st.sampled_from([0.5, 1, 100]))
    return schema


LEAVES = st.one_of(
    string_schemas(), integer_schemas(), number_schemas(), st.just({"type": "boolean"}),
    st.lists(ENUM_VALUES, min_size=1, max_size=4, unique_by=json.dumps).map(
        lambda values: {"enum": values}),
)


@st.composite
def array_schemas(draw: st.DrawFn, items: st.SearchStrategy[dict[str, Any]]
                  ) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array", "items": draw(items)}
    if draw(st.booleans()):
        schema["minItems"] = draw(st.integers(0, 2))
    if draw(st.booleans()):
        schema["maxItems"] = draw(st.integers(max(1, schema.get("minItems", 0)), 4))
    return schema


@st.composite
def object_schemas(draw: st.DrawFn, depth: int) -> dict[str, Any]:
    values: st.SearchStrategy[dict[str, Any]] = st.one_of(LEAVES, array_schemas(LEAVES))
    if depth > 0:
        values = st.one_of(values, object_schemas(depth - 1),
                           array_schemas(object_schemas(depth - 1)))
    names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    schema: dict[str, Any] = {"type": "object",
                              "properties": {name: draw(values) for name in names}}
    required = [name for name in names if draw(st.booleans())]
    if required:
        schema["required"] = required
    extra = draw(st.sampled_from(["absent", "forbidden", "allowed"]))
    if extra == "forbidden":
        schema["additionalProperties"] = False
    elif extra == "allowed":
        schema["additionalProperties"] = True
    return schema


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(schema=object_schemas(depth=2), seed=st.integers(0, 2**31 - len(POLICY_SCALES)))
def test_every_constrained_decode_validates_against_its_schema(
        tokenizer: Tokenizer, compiler: GrammarCompiler, bias: torch.Tensor,
        schema: dict[str, Any], seed: int) -> None:
    grammar = compiler.compile(ResponseFormat.from_schema(schema, strict=True))
    validator = jsonschema.Draft202012Validator(schema)
    for attempt, scale in enumerate(POLICY_SCALES):
        tokens = decode(grammar.new_state(), bias * scale, seed + attempt)
        if attempt and tokens[-1] not in tokenizer.eos_token_ids:
            continue  # a looser policy may run out of tokens; the first one must finish
        validator.validate(json.loads(output_text(tokenizer, tokens)))


def test_json_object_output_is_always_an_object(
        tokenizer: Tokenizer, compiler: GrammarCompiler, bias: torch.Tensor) -> None:
    spec = ResponseFormat.from_openai({"type": "json_object"})
    assert spec is not None
    grammar = compiler.compile(spec)
    outputs = [json.loads(output_text(tokenizer, decode(grammar.new_state(), bias, seed)))
               for seed in range(20)]
    assert all(isinstance(out, dict) for out in outputs)
    assert any(out for out in outputs)  # members are allowed, not only {}


# ----- EOS, replay, rollback -------------------------------------------------------------------
def test_eos_is_allowed_only_once_the_json_is_complete(
        tokenizer: Tokenizer, compiler: GrammarCompiler) -> None:
    state = compiler.compile(ResponseFormat.from_schema(SMALL)).new_state()
    eos = tokenizer.eos_token_ids
    for token in tokenizer.encode('{"a": 12', add_special_tokens=False):
        assert not allowed_ids(state) & eos
        assert state.accept(token)
    assert not allowed_ids(state) & eos  # 12 could still grow, or be closed
    assert state.accept(tokenizer.encode("}", add_special_tokens=False)[0])
    assert allowed_ids(state) == eos
    assert not state.is_terminated()
    assert state.accept(next(iter(eos)))
    assert state.is_terminated()
    assert not state.accept(next(iter(eos)))
    with pytest.raises(GrammarError):
        state.fill_bitmask(allocate_bitmask(1, compiler.vocab_size), 0)


def test_special_tokens_and_padding_are_never_allowed(
        tokenizer: Tokenizer, compiler: GrammarCompiler) -> None:
    """Inside a string (where any text goes) no control token nor padding id is allowed."""
    grammar = compiler.compile(ResponseFormat.json_object())
    state = grammar.new_state(tokenizer.encode('{"a": "x', add_special_tokens=False))
    specials = {i for i, t in tokenizer.hf.get_added_tokens_decoder().items() if t.special}
    allowed = allowed_ids(state)
    assert len(allowed) > 40_000
    assert not allowed & specials
    assert not allowed & set(range(tokenizer.vocab_size, compiler.vocab_size))
    assert not state.accept(min(specials))
    assert not state.accept(compiler.vocab_size - 1)
    assert not state.accept(compiler.vocab_size + 5)


def test_replay_and_rollback_rebuild_the_same_state(
        tokenizer: Tokenizer, compiler: GrammarCompiler, bias: torch.Tensor) -> None:
    grammar = compiler.compile(ResponseFormat.from_schema(
        {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "string"}},
                                          "n": {"type": "number"}},
         "required": ["xs", "n"]}))
    original = grammar.new_state()
    tokens = decode(original, bias, seed=7)
    assert original.is_terminated() and original.num_accepted == len(tokens)
    replayed = grammar.new_state(tokens)
    assert replayed.is_terminated()
    for k in (1, 2, len(tokens) // 2, len(tokens)):
        again = grammar.new_state(tokens)
        again.rollback(k)
        assert again.num_accepted == len(tokens) - k
        assert allowed_ids(again) == allowed_ids(grammar.new_state(tokens[:-k]))
    with pytest.raises(GrammarError):
        replayed.rollback(len(tokens) + 1)
    replayed.reset()
    assert replayed.num_accepted == 0
    assert allowed_ids(replayed) == allowed_ids(grammar.new_state())
    with pytest.raises(GrammarError) as err:
        grammar.new_state(tokenizer.encode('{"n": "x"}', add_special_tokens=False))
    assert err.value.code == "GRAMMAR_ERROR"


def test_compile_is_cached_by_the_canonical_schema(compiler: GrammarCompiler) -> None:
    """Whitespace and string escapes do not change the key; key order does (properties are
    generated in schema order)."""
    a = ResponseFormat.from_openai({"type": "json_schema", "json_schema": {
        "name": "p", "schema": {"type": "object", "required": ["é"],
                                "properties": {"é": {"type": "number", "minimum": 1.5}}}}})
    b = ResponseFormat("json_schema", '{ "type" : "object", "required": ["\\u00e9"],\n'
                                      ' "properties": {"\\u00e9": {"type": "number",'
                                      ' "minimum": 1.5}}}')
    assert a == b and hash(a) == hash(b)
    first = compiler.compile(a)
    assert isinstance(first, CompiledGrammar) and first.spec == a
    assert compiler.compile(b) is first
    reordered = ResponseFormat("json_schema", '{"properties": {"\\u00e9": {"type": "number",'
                                              ' "minimum": 1.5}}, "required": ["\\u00e9"],'
                                              ' "type": "object"}')
    assert reordered != a
    assert compiler.compile(ResponseFormat.from_schema(SMALL, strict=True)) is not first


def test_properties_are_generated_in_schema_order(
        tokenizer: Tokenizer, compiler: GrammarCompiler, bias: torch.Tensor) -> None:
    names = ["zeta", "alpha", "mid"]
    schema = {"type": "object", "properties": {n: {"type": "boolean"} for n in names},
              "required": names}
    grammar = compiler.compile(ResponseFormat.from_schema(schema, strict=True))
    out = json.loads(output_text(tokenizer, decode(grammar.new_state(), bias, seed=1)))
    assert list(out) == names


def test_batched_fill_equals_one_state_at_a_time(
        tokenizer: Tokenizer, compiler: GrammarCompiler, bias: torch.Tensor) -> None:
    grammars = [compiler.compile(ResponseFormat.json_object()),
                compiler.compile(ResponseFormat.from_schema(SMALL))]
    states = [grammars[i % 2].new_state() for i in range(5)]
    for i, state in enumerate(states):
        for token in decode(grammars[i % 2].new_state(), bias, seed=i)[:i]:
            assert state.accept(token)
    batched = allocate_bitmask(6, compiler.vocab_size)
    compiler.fill_bitmasks(batched, states)
    single = allocate_bitmask(6, compiler.vocab_size)
    for i, state in enumerate(states):
        state.fill_bitmask(single, i)
    assert torch.equal(batched, single)
    with pytest.raises(ValueError):
        compiler.fill_bitmasks(allocate_bitmask(4, compiler.vocab_size), states)


def test_concurrent_compiles(tokenizer: Tokenizer, compiler: GrammarCompiler,
                             bias: torch.Tensor) -> None:
    specs = [ResponseFormat.from_schema({"type": "object", "required": [f"k{i}"],
                                         "properties": {f"k{i}": {"type": "integer"}}})
             for i in range(8)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        grammars = list(pool.map(compiler.compile, specs))
    for i, grammar in enumerate(grammars):
        assert grammar.spec == specs[i]
        out = json.loads(output_text(tokenizer, decode(grammar.new_state(), bias, i)))
        assert list(out) == [f"k{i}"]


def test_a_compiler_needs_an_eos(tokenizer: Tokenizer) -> None:
    with pytest.raises(GrammarError):
        GrammarCompiler(tokenizer.hf, eos_token_ids=(), vocab_size=tokenizer.vocab_size)


# ----- bad response formats ----------------------------------------------------------------------
def _schema_format(**fields: object) -> dict[str, object]:
    return {"type": "json_schema", "json_schema": {"name": "out", **fields}}


@pytest.mark.parametrize("value", [
    None, "json_object", [], {}, {"type": "xml"}, {"type": 3},
    {"type": "json_object", "schema": {}}, {"type": "text", "json_schema": {}},
    {"type": "json_schema"}, {"type": "json_schema", "json_schema": "x"},
    {"type": "json_schema", "json_schema": {"schema": {}}},
    _schema_format(name=""), _schema_format(name="a b"), _schema_format(name="x" * 65),
    _schema_format(schema=[]), _schema_format(schema="{}"), _schema_format(),
    _schema_format(schema={}, strict="yes"), _schema_format(schema={}, description=1),
    _schema_format(schema={}, extra=1), _schema_format(schema={"x": float("nan")}),
    _schema_format(schema={"enum": ["x" * 200_000]}),
])
def test_malformed_response_formats_are_refused(value: object) -> None:
    with pytest.raises(InvalidResponseFormat) as err:
        ResponseFormat.from_openai(value)
    assert err.value.code == "INVALID_RESPONSE_FORMAT"
    assert isinstance(err.value, InvalidSamplingParams) and isinstance(err.value, EngineError)


def test_well_formed_response_formats() -> None:
    assert ResponseFormat.from_openai({"type": "text"}) is None
    assert ResponseFormat.from_openai({"type": "json_object"}) == ResponseFormat("json_object")
    spec = ResponseFormat.from_openai(_schema_format(schema=SMALL, strict=None,
                                                     description="d"))
    assert spec == ResponseFormat.from_schema(SMALL) and spec is not None and not spec.strict
    for bad in ("xml", "json_object"):
        with pytest.raises(InvalidResponseFormat):
            ResponseFormat(bad, "{}")  # type: ignore[arg-type]
    with pytest.raises(InvalidResponseFormat):
        ResponseFormat("json_schema", "{not json")


@pytest.mark.parametrize("schema", [
    {"type": "foo"}, {"type": "object", "properties": 5}, {"$ref": "#/$defs/missing"},
    {"type": "string", "pattern": "(("}, {"type": "integer", "minimum": 5, "maximum": 1},
    {"enum": []}, {"type": "array", "minItems": 3, "maxItems": 1},
])
def test_invalid_schemas_are_refused_at_compile(compiler: GrammarCompiler,
                                                schema: dict[str, Any]) -> None:
    with pytest.raises(InvalidResponseFormat) as err:
        compiler.compile(ResponseFormat.from_schema(schema))
    assert err.value.message.startswith("invalid JSON schema: ")


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "properties": {"n": {"type": "integer", "not": {"const": 3}}}},
     "not"),
    ({"type": "array", "items": {"anyOf": [{"type": "array", "contains": {"const": 1}}]}},
     "contains"),
    ({"$defs": {"d": {"type": "object", "if": {"required": ["a"]}}}, "$ref": "#/$defs/d"},
     "if"),
    ({"type": "string", "format": "no-such-format"}, "no-such-format"),
])
def test_strict_refuses_keywords_it_cannot_enforce(compiler: GrammarCompiler,
                                                  schema: dict[str, Any], keyword: str) -> None:
    with pytest.raises(InvalidResponseFormat) as err:
        compiler.compile(ResponseFormat.from_schema(schema, strict=True))
    assert keyword in err.value.message
    best_effort = compiler.compile(ResponseFormat.from_schema(schema))
    assert any(keyword in w for w in best_effort.warnings)


def test_strict_accepts_keyword_names_used_as_data(compiler: GrammarCompiler) -> None:
    schema = {"type": "object", "required": ["not", "if"],
              "properties": {"not": {"enum": ["uniqueItems"]}, "if": {"const": {"not": 1}}}}
    compiler.compile(ResponseFormat.from_schema(schema, strict=True))


# ----- apply_bitmask -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_bitmask_masks_only_the_constrained_rows(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    vocab, mask_vocab = 300, 260  # logits wider than the bitmask: the tail is padding
    logits = torch.randn(6, vocab, generator=gen).to(dtype)
    before = logits.clone()
    bitmask = allocate_bitmask(3, mask_vocab)
    bitmask.copy_(torch.randint(-2**31, 2**31 - 1, bitmask.shape, generator=gen,
                                dtype=torch.int64).to(torch.int32))
    rows = [4, 1]  # bitmask row i masks logits row rows[i]; bitmask row 2 is unused
    apply_bitmask(logits, bitmask, rows)
    for r in (0, 2, 3, 5):
        assert torch.equal(logits[r], before[r])
    covered = bitmask.shape[1] * 32
    for i, r in enumerate(rows):
        for token in range(vocab):
            bit = (int(bitmask[i, token // 32]) >> (token % 32)) & 1 if token < covered else 0
            want = before[r, token] if bit else torch.tensor(float("-inf"), dtype=dtype)
            assert logits[r, token].item() == want.item(), (r, token)
    apply_bitmask(logits, bitmask, [])  # no constrained row: nothing to do
    with pytest.raises(ValueError):
        apply_bitmask(logits, bitmask, [1, 1])
    with pytest.raises(ValueError):
        apply_bitmask(logits, bitmask, [0, 1, 2, 3])
