"""Image processing: read the data out of band, write the result, ack, in one transaction."""

from __future__ import annotations

from django.utils import timezone

from demo_project.images.models import ImageTasks, ImageUpload
from demo_project.images.pixels import parse_ppm, thumbnail
from spanner_queues import receiver
from spanner_queues.message import Message


@receiver(ImageTasks)
def make_thumbnail(message: Message) -> None:
    """Pattern 5: the message is just a key; the upload row holds the bytes."""
    upload = ImageUpload.objects.filter(pk=message.key_dict["upload_id"]).first()
    if upload is None:  # deleted (on Spanner its tasks would have gone with it)
        return
    width, height, _ = parse_ppm(bytes(upload.data))
    upload.width, upload.height = width, height
    upload.thumbnail = thumbnail(bytes(upload.data))
    upload.processed_at = timezone.now()
    upload.save(update_fields=["width", "height", "thumbnail", "processed_at"])
