"""Simulated users: sign-ups, orders, uploads, profile edits, reports, and now and then a worker
that dies. Traffic comes in waves (busy, then quiet) so queues visibly fill and drain."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

from django.contrib.auth.models import User
from django.db import connections

from demo_project.accounts.services import sign_up, update_profile
from demo_project.images.pixels import make_ppm
from demo_project.images.services import upload_image
from demo_project.ops.heartbeat import send_beat
from demo_project.reports.services import request_report
from demo_project.shop.models import Product
from demo_project.shop.services import place_order, restock

logger = logging.getLogger(__name__)

PRODUCTS = [
    ("MUG-01", "Queue mug", 1200, 40),
    ("TEE-02", "Spanner t-shirt", 2500, 25),
    ("CAP-03", "Lease cap", 1800, 15),
    ("PIN-04", "Ack pin", 300, 60),
]
WORDS = ["ada", "alan", "grace", "edsger", "barbara", "donald", "frances", "ken", "leslie"]
BIOS = ["likes queues", "ships on Fridays", "collects mugs", "reads the docs", "acks promptly"]


class TrafficGenerator:
    """``run(stop)`` generates ``rate`` actions a second for ``busy`` seconds, then pauses for
    ``quiet`` seconds, until ``stop`` is set."""

    def __init__(
        self,
        *,
        rate: float = 4.0,
        busy: float = 20.0,
        quiet: float = 15.0,
        seed: int | None = None,
        write: Callable[[str], None] = print,
    ) -> None:
        self.rate = rate
        self.busy = busy
        self.quiet = quiet
        self.rng = random.Random(seed)
        self.write = write
        self.counts: Counter[str] = Counter()
        self.waves = 0
        self.actions: list[tuple[Callable[[], None], int]] = [
            (self.sign_up, 25),
            (self.place_order, 35),
            (self.upload_image, 15),
            (self.edit_profile, 20),
            (self.restock, 5),
        ]

    # --- actions ---------------------------------------------------------------------------
    def setup(self) -> None:
        for sku, name, price, stock in PRODUCTS:
            Product.objects.get_or_create(
                sku=sku, defaults={"name": name, "price_cents": price, "stock": stock}
            )

    def _user_id(self) -> int:
        ids = list(User.objects.filter(is_staff=False).values_list("pk", flat=True)[:200])
        if not ids:
            self.sign_up()
            return self._user_id()
        return self.rng.choice(ids)

    def sign_up(self) -> None:
        name = f"{self.rng.choice(WORDS)}-{uuid.uuid4().hex[:6]}"
        # Every fourth user gets a trial that ends a day and 30 s from now: their reminder
        # (due a day before the end) arrives during the demo. The others' is 29 days away.
        short = self.counts["sign_up"] % 4 == 0
        trial = timedelta(days=1, seconds=30) if short else timedelta(days=30)
        sign_up(name, f"{name}@example.com", trial=trial)
        self.counts["sign_up"] += 1

    def place_order(self) -> None:
        product = self.rng.choice(list(Product.objects.all()))
        place_order(self._user_id(), product, quantity=self.rng.randint(1, 3))
        self.counts["order"] += 1

    def upload_image(self) -> None:
        n = self.counts["upload"]
        data = make_ppm(self.rng.randint(64, 160), self.rng.randint(64, 160), seed=n)
        upload_image(self._user_id(), f"photo-{n}.ppm", data)
        self.counts["upload"] += 1

    def edit_profile(self) -> None:
        update_profile(
            self._user_id(),
            display_name=self.rng.choice(WORDS).title(),
            bio=self.rng.choice(BIOS),
        )
        self.counts["profile_edit"] += 1

    def restock(self) -> None:
        restock(self.rng.choice(list(Product.objects.all())), self.rng.randint(5, 20))
        self.counts["restock"] += 1

    def start_wave(self) -> None:
        """Once a wave: a report (alternating kinds) and, every other wave, a simulated worker
        (``simulated-crash-...``) that beats once with a 20 s timeout and is never heard of
        again: the alert that follows says it is simulated."""
        self.waves += 1
        if self.waves % 2:
            request_report("sales_export", rows=300)
        else:
            request_report("ledger_audit")
            send_beat(
                f"simulated-crash-{uuid.uuid4().hex[:4]}",
                timeout=timedelta(seconds=20),
                simulated="the demo's traffic generator: this worker beats once, then stops",
            )
            self.counts["dead_worker"] += 1
        self.counts["report"] += 1

    def step(self) -> None:
        actions, weights = zip(*self.actions, strict=True)
        self.rng.choices(actions, weights=weights)[0]()

    # --- loop ------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        try:
            self.setup()
            while not stop.is_set():
                try:
                    self.start_wave()
                except Exception:  # a failed action must not stop the demo
                    logger.exception("traffic action failed")
                end = time.monotonic() + self.busy
                while not stop.is_set() and time.monotonic() < end:
                    try:
                        self.step()
                    except Exception:  # a failed action must not stop the demo
                        logger.exception("traffic action failed")
                    stop.wait(self.rng.expovariate(self.rate))
                self.write(f"traffic: wave {self.waves} done; so far {dict(self.counts)}")
                stop.wait(self.quiet)
        finally:
            connections.close_all()
