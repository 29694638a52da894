"""Orders: inventory, payment, shipment, and the join that waits for both halves."""

from __future__ import annotations

from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "demo_project.shop"
    label = "shop"
