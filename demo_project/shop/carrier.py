"""A fake shipping carrier API: rate-limited (HTTP 429 with Retry-After) and idempotent. Its 429
is part of the demo, not a fault: the error, and so the worker's retry log line, says
"simulated"."""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from datetime import timedelta

from django.db import IntegrityError

from demo_project.shop.models import CarrierBooking


class RateLimited(Exception):
    """HTTP 429 Too Many Requests (the demo's carrier is simulated, and says so)."""

    def __init__(self, retry_after: timedelta) -> None:
        seconds = retry_after.total_seconds()
        super().__init__(f"simulated 429 Too Many Requests; Retry-After: {seconds:g}")
        self.retry_after = retry_after


class Carrier:
    """Accepts ``max_calls`` bookings per ``per`` seconds (per process); answers 429 beyond."""

    def __init__(self, max_calls: int = 10, per: float = 10.0, retry_after: float = 10.0) -> None:
        self.max_calls = max_calls
        self.per = per
        self.retry_after = timedelta(seconds=retry_after)
        self._calls: deque[float] = deque()
        self._lock = threading.Lock()

    def book(self, idempotency_key: str) -> str:
        """Book a pickup; the same key always returns the same tracking number."""
        with self._lock:
            now = time.monotonic()
            while self._calls and self._calls[0] <= now - self.per:
                self._calls.popleft()
            if len(self._calls) >= self.max_calls:
                raise RateLimited(self.retry_after)
            self._calls.append(now)
        existing = CarrierBooking.objects.filter(idempotency_key=idempotency_key).first()
        if existing:
            return existing.tracking_number
        try:
            return CarrierBooking.objects.create(
                idempotency_key=idempotency_key, tracking_number=uuid.uuid4().hex[:12].upper()
            ).tracking_number
        except IntegrityError:  # a concurrent retry booked it first
            return CarrierBooking.objects.get(idempotency_key=idempotency_key).tracking_number


carrier = Carrier()
