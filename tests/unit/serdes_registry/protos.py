"""Protobuf message classes for the tests, built from descriptors (no protoc needed).

``shop/common.proto`` holds ``Money``; ``shop/orders.proto`` imports it and Google's Timestamp
and holds ``Order`` (with a nested ``Order.Line``) and ``Refund``: so a serde has references to
register, a well-known import to skip, and message indexes other than ``[0]``.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

F = descriptor_pb2.FieldDescriptorProto


def _field(message: Any, name: str, number: int, kind: int, type_name: str = "", repeated: bool = False) -> None:
    field = message.field.add(name=name, number=number, type=kind,
                              label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
    if type_name:
        field.type_name = type_name


def _build() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)

    common = descriptor_pb2.FileDescriptorProto(name="shop/common.proto", package="shop", syntax="proto3")
    money = common.message_type.add(name="Money")
    _field(money, "currency", 1, F.TYPE_STRING)
    _field(money, "cents", 2, F.TYPE_INT64)
    pool.Add(common)

    orders = descriptor_pb2.FileDescriptorProto(name="shop/orders.proto", package="shop", syntax="proto3",
                                                dependency=["shop/common.proto", "google/protobuf/timestamp.proto"])
    refund = orders.message_type.add(name="Refund")
    _field(refund, "order_id", 1, F.TYPE_INT64)
    order = orders.message_type.add(name="Order")
    _field(order, "id", 1, F.TYPE_INT64)
    _field(order, "customer", 2, F.TYPE_STRING)
    _field(order, "total", 3, F.TYPE_MESSAGE, ".shop.Money")
    _field(order, "placed", 4, F.TYPE_MESSAGE, ".google.protobuf.Timestamp")
    _field(order, "lines", 5, F.TYPE_MESSAGE, ".shop.Order.Line", repeated=True)
    line = order.nested_type.add(name="Line")
    _field(line, "sku", 1, F.TYPE_STRING)
    _field(line, "quantity", 2, F.TYPE_INT32)
    pool.Add(orders)

    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"shop.{name}"))
            for name in ("Money", "Order", "Order.Line", "Refund")}


_CLASSES = _build()
Money: Any = _CLASSES["Money"]
Order: Any = _CLASSES["Order"]
OrderLine: Any = _CLASSES["Order.Line"]
Refund: Any = _CLASSES["Refund"]
