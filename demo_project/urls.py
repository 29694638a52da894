from __future__ import annotations

from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/spanner_queues/queues/", permanent=False)),
    path("admin/", admin.site.urls),
]
