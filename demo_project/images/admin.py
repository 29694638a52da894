from __future__ import annotations

from django.contrib import admin

from demo_project.images.models import ImageUpload


@admin.register(ImageUpload)
class ImageUploadAdmin(admin.ModelAdmin):
    list_display = ("filename", "owner", "uploaded_at", "width", "height", "processed_at")
    exclude = ("data", "thumbnail")
