"""aliasguard._C._op_alias_info: the C++ schema analysis as Python sees it."""

import pytest
import torch

import aliasguard  # noqa: F401
from aliasguard import _C

aten = torch.ops.aten


def test_view_op():
    info = _C._op_alias_info(aten.view.default)
    assert info.name == "aten::view"
    assert info.returns == (("view", 0, "self", False),)
    assert info.written_arguments == ()
    assert info.has_view_returns and not info.has_write_returns and info.may_return_views


def test_in_place_and_out_ops_name_what_they_write():
    add_ = _C._op_alias_info(aten.add_.Tensor)
    assert add_.written_arguments == ((0, "self"),)
    assert add_.returns == (("write", 0, "self", False),)
    assert add_.has_write_returns and not add_.may_return_views
    max_out = _C._op_alias_info(aten.max.dim_max)
    assert max_out.written_arguments == ((3, "max"), (4, "max_values"))
    assert [r[0] for r in max_out.returns] == ["write", "write"]


def test_written_list_and_ambiguous_annotations():
    foreach = _C._op_alias_info(aten._foreach_add_.Scalar)
    assert foreach.written_arguments == ((0, "self"),)
    split = _C._op_alias_info(aten.split.Tensor)
    assert split.returns == (("view", 0, "self", True),) and split.may_return_views
    # A TorchScript-only operator (no dispatcher entry) never reaches a
    # __torch_dispatch__: there is nothing to say about it.
    assert _C._op_alias_info(aten.to.prim_dtype) is None


def test_fresh_op_and_non_operators():
    add = _C._op_alias_info(aten.add.Tensor)
    assert add.returns == (("fresh", None, None, False),)
    assert not (add.written_arguments or add.has_view_returns or add.may_return_views)
    assert _C._op_alias_info(torch.ops.higher_order.cond) is None
    assert _C._op_alias_info(object()) is None
    assert "aten::view" in repr(_C._op_alias_info(aten.view.default))


def _python_reading(schema):
    written = tuple(
        (i, a.name) for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write
    )
    views = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    return written, views


def test_agrees_with_the_schema_for_every_aten_overload():
    checked = 0
    for schema in torch._C._jit_get_all_schemas():
        namespace, _, name = schema.name.partition("::")
        if namespace != "aten":
            continue
        packet = getattr(aten, name, None)
        op = getattr(packet, schema.overload_name or "default", None) if packet is not None else None
        if op is None or op._schema.overload_name != schema.overload_name:
            continue
        info = _C._op_alias_info(op)
        if info is None:  # TorchScript-only: the dispatcher does not know it
            with pytest.raises(RuntimeError):
                torch._C._dispatch_find_schema_or_throw(schema.name, schema.overload_name)
            continue
        written, views = _python_reading(op._schema)
        assert (info.written_arguments, info.may_return_views) == (written, views), str(op._schema)
        checked += 1
    assert checked > 2000


def test_schema_alias_info_by_name_still_raises_for_unknown_ops():
    with pytest.raises(ValueError, match="aten::no_such_op"):
        _C._schema_alias_info("aten::no_such_op")
