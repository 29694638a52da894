"""Image uploads, processed by a queue interleaved in the upload table."""

from __future__ import annotations

from django.apps import AppConfig


class ImagesConfig(AppConfig):
    name = "demo_project.images"
    label = "images"
