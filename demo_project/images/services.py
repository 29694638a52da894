"""Uploading an image: the row and its processing message in one transaction."""

from __future__ import annotations

from django.db import transaction

from demo_project.images.models import ImageTasks, ImageUpload


def upload_image(owner_id: int, filename: str, data: bytes) -> ImageUpload:
    """Store the image and queue ``ImageTasks(upload, "thumbnail")`` with an empty payload:
    the receiver reads the data from the upload row (messages stay tiny)."""
    with transaction.atomic():
        upload = ImageUpload.objects.create(owner_id=owner_id, filename=filename, data=data)
        ImageTasks.send(upload=upload, message_id="thumbnail")  # payload b""
    return upload
