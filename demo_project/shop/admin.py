from __future__ import annotations

from django.contrib import admin

from demo_project.shop.models import Order, Payment, Product


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ("sku", "name", "price_cents", "stock")


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "customer",
        "product",
        "quantity",
        "status",
        "created_at",
        "tracking_number",
    )
    list_filter = ("needs_attention",)


@admin.register(Payment)
class PaymentAdmin(admin.ModelAdmin):
    list_display = ("order", "amount_cents", "captured_at", "reference")
