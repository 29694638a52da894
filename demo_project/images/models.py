"""Image uploads and the queue interleaved in them (pattern 5, large payloads)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from spanner_queues.models import Queue


class ImageUpload(models.Model):
    """The image itself lives here, out of band: the queue message carries only its key."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    filename = models.CharField(max_length=200)
    data = models.BinaryField()
    uploaded_at = models.DateTimeField(auto_now_add=True)
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    thumbnail = models.BinaryField(null=True, blank=True)
    processed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.filename


class ImageTasks(Queue):
    """``INTERLEAVE IN PARENT images_imageupload ON DELETE CASCADE`` on Spanner: the key starts
    with the parent's key column (same name, ``id``), so a task is stored with its upload and
    deleting the upload deletes its pending tasks. Elsewhere the ForeignKey's CASCADE does it."""

    upload = models.ForeignKey(
        ImageUpload,
        on_delete=models.CASCADE,
        db_column="id",  # Spanner: the interleaved key column is named like the parent's pk
        db_constraint=False,  # interleaving is the constraint on Spanner
        related_name="+",
    )
    message_id = models.CharField(max_length=32)
    pk = models.CompositePrimaryKey("upload", "message_id")

    class QueueMeta:
        interleave_in_parent = "upload"

    class Meta:
        verbose_name_plural = "image tasks"
