"""Placing orders and restocking."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F

from demo_project.shop.models import Order, OrderTasks, Product


def place_order(customer_id: int, product: Product, quantity: int = 1) -> Order:
    """Create the order and its two independent tasks (reserve stock, capture payment) in one
    transaction; they run in parallel and meet again in ``OrderChecks``."""
    with transaction.atomic():
        order = Order.objects.create(
            customer_id=customer_id,
            product=product,
            quantity=quantity,
            amount_cents=product.price_cents * quantity,
        )
        OrderTasks.send_many(
            [
                {"order_id": order.pk, "kind": "reserve_inventory"},
                {"order_id": order.pk, "kind": "capture_payment"},
            ]
        )
    return order


def restock(product: Product, quantity: int) -> None:
    Product.objects.filter(pk=product.pk).update(stock=F("stock") + quantity)
