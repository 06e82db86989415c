"""Every registered lowering agrees with the schema of each since-version it claims: onnx's
for ai.onnx and ai.onnx.ml, ONNX Runtime's for com.microsoft and for the few ai.onnx-domain ops only ONNX
Runtime defines (the legacy LayerNormalization-1, SimplifiedLayerNormalization)."""

from __future__ import annotations

import functools
import inspect

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import helper

from transmuter.lowering import registered

REGISTERED = [d for d in registered() if d.domain in ("", "ai.onnx.ml", "com.microsoft")]
ONNX_DOMAINS = ("", "ai.onnx.ml")  # schemas from onnx.defs; com.microsoft's from ONNX Runtime


@functools.cache
def _ort_schemas() -> dict[tuple[str, str], list]:
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    found: dict[tuple[str, str], list] = {}
    for schema in C.get_all_operator_schema():
        found.setdefault((schema.domain, schema.name), []).append(schema)
    return found


def _schema(opdef):
    """The schema in force at the registered since-version, as onnx.defs.get_schema finds it."""
    if opdef.domain in ONNX_DOMAINS:
        try:
            return onnx.defs.get_schema(opdef.op_type, opdef.since, opdef.domain)
        except onnx.defs.SchemaError:
            pass
    versions = [
        s
        for s in _ort_schemas().get((opdef.domain, opdef.op_type), [])
        if s.since_version <= opdef.since
    ]
    return max(versions, key=lambda s: s.since_version, default=None)


def _kwonly(opdef):
    return {
        p.name: p
        for p in inspect.signature(opdef.fn).parameters.values()
        if p.kind is p.KEYWORD_ONLY
    }


def _schema_default(attr):
    if hasattr(attr, "default_value"):
        proto = attr.default_value
    else:  # ONNX Runtime's schemas hold the default serialized
        proto = onnx.AttributeProto.FromString(attr._default_value)
    if not proto.name:
        return inspect.Parameter.empty
    value = helper.get_attribute_value(proto)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return tuple(v.decode() if isinstance(v, bytes) else v for v in value)
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value


@pytest.mark.parametrize("opdef", REGISTERED, ids=lambda d: d.name)
def test_since_version_is_a_schema_version(opdef):
    schema = _schema(opdef)
    assert schema is not None, f"{opdef.name}: neither onnx nor ONNX Runtime has such an operator"
    assert schema.since_version == opdef.since, (
        f"{opdef.name}: onnx defines versions at {schema.since_version}, not {opdef.since}"
    )


@pytest.mark.parametrize("opdef", REGISTERED, ids=lambda d: d.name)
def test_attributes_and_defaults_match_schema(opdef):
    schema = _schema(opdef)
    if schema is None:
        pytest.fail(f"{opdef.name}: no schema")
    params = _kwonly(opdef)
    assert set(params) == set(schema.attributes), (
        f"{opdef.name}: keyword-only parameters {sorted(params)} differ from the schema's "
        f"attributes {sorted(schema.attributes)}"
    )
    for name, attr in schema.attributes.items():
        want = _schema_default(attr)
        got = params[name].default
        if want is inspect.Parameter.empty:
            assert attr.required or got in (inspect.Parameter.empty, None), (
                f"{opdef.name}.{name}: the schema has no default; an optional attribute "
                "without default is None in the signature"
            )
            continue
        if isinstance(want, np.ndarray):
            np.testing.assert_array_equal(np.asarray(got), want, err_msg=f"{opdef.name}.{name}")
        elif isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-6), f"{opdef.name}.{name}: {got} != {want}"
        else:
            assert got == want, f"{opdef.name}.{name}: default {got!r}, schema {want!r}"


@pytest.mark.parametrize("opdef", REGISTERED, ids=lambda d: d.name)
def test_positional_inputs_match_schema(opdef):
    schema = _schema(opdef)
    if schema is None:
        pytest.fail(f"{opdef.name}: no schema")
    params = [
        p
        for p in inspect.signature(opdef.fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ][1 if opdef.context else 0 :]
    formal = schema.inputs
    variadic = bool(formal) and formal[-1].option == formal[-1].option.Variadic
    if variadic:
        assert params and params[-1].kind is params[-1].VAR_POSITIONAL, (
            f"{opdef.name}: the last input is variadic; take it as *{formal[-1].name}"
        )
        params = params[:-1]
        formal = formal[:-1]
    assert len(params) == len(formal), (
        f"{opdef.name}: {len(params)} positional inputs, the schema has {len(formal)}"
    )
    for i, (p, f) in enumerate(zip(params, formal)):
        optional = f.option == f.option.Optional
        # Python cannot default a parameter followed by required ones (ORT's
        # EmbedLayerNormalization has an optional segment_ids before its embeddings); such an
        # input receives None when absent all the same.
        if optional and any(g.option == g.option.Single for g in formal[i + 1 :]):
            assert p.default in (None, inspect.Parameter.empty), f"{opdef.name}: {p.name}"
            continue
        assert (p.default is None) == optional, (
            f"{opdef.name}: input {p.name!r} ({f.name} in the schema) must "
            f"{'default to None' if optional else 'have no default'}"
        )
