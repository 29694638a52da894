"""``QueuesAdmin``: the overview, message browser, detail and action pages on the admin site.

URLs (under ``admin/spanner_queues/queues/``):

- ``""``: every declared queue with its counts and depth chart (the admin index links here);
- ``<queue label>/``: the queue's messages, filtered by state, searched by key, paginated;
- ``<queue label>/messages/<key>/``: one message;
- ``<queue label>/actions/``: POST only; asks for confirmation, then performs the action;
- ``<queue label>/bulk/``: POST only; a filter and an operation: the preview count and a
  confirmation, then the operation on every matching message, ``BULK_PER_REQUEST`` at most per
  request in batches of ``admin.bulk.BATCH_SIZE`` (one transaction each); a larger set shows
  its counts so far and continues by itself (``static/spanner_queues/admin/bulk.js`` posts the
  next part; without JavaScript, a button), each part one entry in the admin history;
- ``<queue label>/pause/``: POST only; pauses or resumes the queue for every worker
  (``spanner_queues.pause_queue``).

The overview also lists the ``@periodic`` schedules with their next run.

Staff need ``spanner_queues.view_queues`` to see any page, and each action's own permission.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from spanner_queues import clock, controls
from spanner_queues.admin.actions import (
    ACTIONS,
    VIEW_PERMISSION,
    QueueAction,
    actions_for,
    dead_letter_target,
    perform,
    replay_target,
)
from spanner_queues.admin.browse import (
    STATE_LABELS,
    STATES,
    Payload,
    get_messages,
    has_bookkeeping,
    key_text,
    key_token,
    label_html,
    messages_queryset,
    ordering,
    parse_key_token,
    render_payload,
    search_filter,
    state_filter,
    state_of,
    visible,
)
from spanner_queues.admin.bulk import (
    FILTER_STATES,
    OPERATION_EXPLANATIONS,
    OPERATION_LABELS,
    OPERATIONS,
    MessageFilter,
    cursor_token,
    default_move_target,
    describe_operation,
    move_targets,
    parse_cursor,
    permission_action,
    run_bulk,
)
from spanner_queues.admin.bulk import count as count_matching
from spanner_queues.admin.chart import DepthChart, depth_chart, recent_samples
from spanner_queues.api import _deliver_time
from spanner_queues.causes import FailureCause, causes_of
from spanner_queues.deadletter import sources_of
from spanner_queues.engines import engine_for
from spanner_queues.engines.stats import stats_cache
from spanner_queues.exceptions import InvalidMessage, QueueError, UnknownQueue
from spanner_queues.keys import key_names, row_to_message
from spanner_queues.options import queue_options
from spanner_queues.patterns import schedules
from spanner_queues.queues import get_queue, queue_models
from spanner_queues.storage import rows as queue_rows

#: pausing and resuming a queue from the overview
PAUSE_PERMISSION = "spanner_queues.pause_queue"

if TYPE_CHECKING:
    from spanner_queues.engines.base import QueueStats
    from spanner_queues.message import Message
    from spanner_queues.models import Queue

PER_PAGE = 50
#: the most messages one request of a bulk action reads; a larger set continues in the next
BULK_PER_REQUEST = 2000
SELECTED = "_selected_key"


def format_age(age: timedelta | None) -> str:
    """``2d 3h``, ``3h 05m``, ``4m 10s``, ``12s``; an em dash for None."""
    if age is None:
        return "—"
    seconds = int(age.total_seconds())
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One line of the overview."""

    model: type[Queue]
    label: str
    url: str
    engine: str
    stats: QueueStats | None
    error: str
    oldest_age: str
    attempts: bool
    max_attempts_limit: int | None
    dead_letter_queue: str | None
    dead_letter_url: str
    dead_letter_count: int | None
    dead_letter_of: list[str]
    chart: DepthChart | None
    #: the pause of this queue (None: running)
    paused: controls.PausedQueue | None = None
    pause_url: str = ""
    #: ``QueueMeta.pubsub_topic`` (relayed) and ``pubsub_subscription`` (an inbox), as declared
    pubsub_topic: str | None = None
    pubsub_subscription: str | None = None

    @property
    def label_html(self) -> SafeString:
        return label_html(self.label)

    @property
    def dead_letter_html(self) -> SafeString:
        return label_html(self.dead_letter_queue or "")

    @property
    def dead_letter_of_html(self) -> SafeString:
        """The queues that dead-letter into this one, each label free to wrap."""
        return mark_safe(", ".join(label_html(label) for label in self.dead_letter_of))


@dataclass(frozen=True)
class ScheduleRow:
    """One ``@periodic`` schedule on the overview."""

    queue: str
    key: str
    runs: str
    #: the deliver time of its queued message (None: not seeded yet, or gone)
    next_run: datetime | None
    error: str = ""

    @property
    def queue_html(self) -> SafeString:
        return label_html(self.queue)


def _schedule_rows() -> list[ScheduleRow]:
    """Every registered schedule, with the deliver time of the message that is its next run."""
    found = []
    for schedule in schedules():
        model = get_queue(schedule.queue)
        if schedule.cron is not None:
            runs = f"cron {schedule.cron.expression} ({schedule.cron.zone})"
        else:
            runs = f"every {schedule.every}"
        key = ", ".join(f"{k}={v!r}" for k, v in schedule.key.items())
        try:
            row = queue_rows(model, engine_for(model).database).filter(**schedule.key).first()
        except (DatabaseError, QueueError) as exc:
            found.append(ScheduleRow(model._meta.label, key, runs, None, f"{exc}"))
            continue
        found.append(ScheduleRow(model._meta.label, key, runs, row.deliver_time if row else None))
    return found


#: seconds between the overview's own refreshes (``static/spanner_queues/admin/overview.js``
#: fetches the page again and swaps its counts; the operator can pause it)
OVERVIEW_REFRESH_SECONDS = 5


@dataclass(frozen=True, slots=True)
class MessageRow:
    """One message as the browser and the confirmation page show it."""

    message: Message
    token: str
    url: str
    state: str
    payload: Payload
    key_text: SafeString  # the key for display, bidi controls made visible

    @property
    def state_label(self) -> str:
        return STATE_LABELS[self.state]


class RescheduleForm(forms.Form):
    deliver_time = forms.DateTimeField(
        label="Deliver at",
        widget=forms.DateTimeInput(
            attrs={"type": "datetime-local", "step": 1}, format="%Y-%m-%dT%H:%M:%S"
        ),
        help_text="In the server's time zone.",
    )

    def clean_deliver_time(self) -> datetime:
        """A time every database can store, leases and back-off added (not 9999-12-31 in a
        time zone behind UTC, nor year 1 ahead of it)."""
        value: datetime = self.cleaned_data["deliver_time"]
        try:
            return _deliver_time(value, None) or value
        except InvalidMessage as exc:
            raise forms.ValidationError(str(exc)) from None


class CancelForm(forms.Form):
    reason = forms.CharField(
        label="Reason",
        max_length=1000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Kept with the cancellation, with your name.",
    )


class QueuesAdmin(admin.ModelAdmin):
    """Mounts the queue pages on an admin site; registered for the table-less ``Queues``."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(VIEW_PERMISSION)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        site = self.admin_site
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", site.admin_view(self.overview_view), name=f"{name}_changelist"),
            path("<str:queue>/", site.admin_view(self.messages_view), name=f"{name}_messages"),
            path("<str:queue>/actions/", site.admin_view(self.action_view), name=f"{name}_action"),
            path("<str:queue>/pause/", site.admin_view(self.pause_view), name=f"{name}_pause"),
            path("<str:queue>/bulk/", site.admin_view(self.bulk_view), name=f"{name}_bulk"),
            path(
                "<str:queue>/messages/<str:key>/",
                site.admin_view(self.message_view),
                name=f"{name}_message",
            ),
        ]

    # --- helpers ----------------------------------------------------------------------------
    def _url(self, view: str, *args: str) -> str:
        name = f"{self.opts.app_label}_{self.opts.model_name}_{view}"
        return reverse(f"{self.admin_site.name}:{name}", args=args)

    def _require_view(self, request: HttpRequest) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied

    def _queue(self, label: str) -> type[Queue]:
        """The queue named in the URL; a 404 that names no other queue (callers check the
        view permission first)."""
        try:
            return get_queue(label)
        except UnknownQueue:
            raise Http404("No such queue.") from None

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "overview_url": self._url("changelist"),
            **extra,
        }

    def _queue_context(self, model: type[Queue]) -> dict[str, Any]:
        engine = engine_for(model)
        return {
            "queue": model,
            "queue_label": model._meta.label,
            "queue_name": model._meta.verbose_name_plural,
            "queue_url": self._url("messages", model._meta.label_lower),
            "action_url": self._url("action", model._meta.label_lower),
            "bulk_url": self._url("bulk", model._meta.label_lower),
            "engine": engine,
            "engine_class": type(engine).__name__,
            "bookkeeping": has_bookkeeping(engine),
            "key_names": key_names(model),
        }

    def _row(self, model: type[Queue], message: Message, now: datetime) -> MessageRow:
        return MessageRow(
            message=message,
            token=key_token(message.key),
            url=self._url("message", model._meta.label_lower, key_token(message.key)),
            state=state_of(message, now),
            payload=render_payload(message.payload, pretty=False),
            key_text=key_text(message),
        )

    # --- overview ---------------------------------------------------------------------------
    def overview_view(self, request: HttpRequest) -> HttpResponse:
        self._require_view(request)
        models = queue_models()
        measured: dict[str, QueueStats] = {}
        errors: dict[str, str] = {}
        # The page's own refreshes (overview.js, per open tab) share the process's stats cache:
        # each queue is scanned at most once per refresh interval; a page load reads now.
        refresh = request.headers.get("X-Requested-With") == "XMLHttpRequest"
        max_age = OVERVIEW_REFRESH_SECONDS if refresh else None
        for model in models:
            try:
                measured[model._meta.label] = stats_cache.get(model, max_age=max_age)
            except (DatabaseError, QueueError) as exc:
                errors[model._meta.label] = f"{type(exc).__name__}: {exc}"
        # A GET writes nothing: depth samples are recorded by a worker or a cron job
        # (record_depth_samples); the chart ends with the live counts of this page.
        try:
            paused = controls.paused(models)
        except DatabaseError:
            paused = {}
        rows = []
        for model in models:
            label = model._meta.label
            stats = measured.get(label)
            engine = engine_for(model)
            target = dead_letter_target(model)
            target_stats = measured.get(target) if target else None
            rows.append(
                QueueRow(
                    model=model,
                    label=label,
                    url=self._url("messages", model._meta.label_lower),
                    engine=engine.alias,
                    stats=stats,
                    error=errors.get(label, ""),
                    oldest_age=format_age(stats.oldest_age if stats else None),
                    attempts=engine.features.supports_attempt_count,
                    max_attempts_limit=queue_options(model).max_attempts,
                    dead_letter_queue=target,
                    dead_letter_url=self._url("messages", target.lower()) if target else "",
                    dead_letter_count=target_stats.total if target_stats else None,
                    dead_letter_of=[m._meta.label for m in sources_of(model)],
                    chart=depth_chart(recent_samples(label, stats)),
                    paused=paused.get(label),
                    pause_url=self._url("pause", model._meta.label_lower),
                    pubsub_topic=queue_options(model).pubsub_topic,
                    pubsub_subscription=queue_options(model).pubsub_subscription,
                )
            )
        context = self._context(
            request,
            "Queues",
            rows=rows,
            now=clock.now(),
            refresh_seconds=OVERVIEW_REFRESH_SECONDS,
            can_pause=request.user.has_perm(PAUSE_PERMISSION),
            schedules=_schedule_rows(),
        )
        return TemplateResponse(request, "spanner_queues/admin/overview.html", context)

    def pause_view(self, request: HttpRequest, queue: str) -> HttpResponse:
        """POST ``op=pause`` (with an optional ``reason``) or ``op=resume``: for every worker."""
        self._require_view(request)  # before the queue is looked up: nothing leaks
        model = self._queue(queue)
        back = HttpResponseRedirect(self._url("changelist"))
        if request.method != "POST":
            return back
        if not request.user.has_perm(PAUSE_PERMISSION):
            raise PermissionDenied
        op = request.POST.get("op")
        label = model._meta.label
        try:
            if op == "pause":
                reason = request.POST.get("reason", "").strip() or f"paused by {request.user}"
                done = controls.pause(model, reason=reason)
                text = f"Paused {label} for every worker" if done else f"{label} was paused"
                history = f"Paused for every worker: {reason}."
            elif op == "resume":
                done = controls.resume(model)
                text = (
                    f"Resumed {label}: workers receive from it again"
                    if done
                    else (f"{label} was not paused")
                )
                history = "Resumed: workers receive from it again."
            else:
                messages.warning(request, "Nothing was changed.")
                return back
            if done:
                self._log_control(request, model, history)
        except (DatabaseError, QueueError) as exc:
            messages.error(request, f"Nothing was changed: {exc}")
            return back
        messages.success(request, f"{text}.")
        return back

    def _log_control(self, request: HttpRequest, model: type[Queue], change: str) -> None:
        """An entry in the admin history (``LogEntry``, in the queue's database like the
        actions' entries) for a pause or resume: on ``Queues``, object id the queue's label."""
        db = engine_for(model).database
        LogEntry.objects.using(db).create(
            user_id=cast(Any, request.user.pk),
            content_type_id=ContentType.objects.db_manager(db).get_for_model(self.model).pk,
            object_id=model._meta.label,
            object_repr=model._meta.label,
            action_flag=CHANGE,
            change_message=change[:1000],
        )

    # --- one queue --------------------------------------------------------------------------
    def messages_view(self, request: HttpRequest, queue: str) -> HttpResponse:
        self._require_view(request)
        model = self._queue(queue)
        engine = engine_for(model)
        bookkeeping = has_bookkeeping(engine)
        now = clock.now()
        state = request.GET.get("state", "")
        state = state if state in STATES else ""
        term = request.GET.get("q", "").strip()
        descending = request.GET.get("o", "") == "-deliver_time"
        page = None
        listing = engine.features.supports_listing
        if listing:
            page = self._page(
                request, model, state, term, descending=descending, now=now, bookkeeping=bookkeeping
            )
        params = {"state": state, "q": term, "o": "-deliver_time" if descending else ""}

        def query(**changes: str) -> str:
            merged = {k: v for k, v in (params | changes).items() if v}
            return "?" + urlencode(merged) if merged else "?"

        stats = _try_stats(model)
        context = self._context(
            request,
            f"Messages in {model._meta.label}",
            **self._queue_context(model),
            page=page,
            listing=listing,
            state=state,
            term=term,
            descending=descending,
            order_query=query(o="" if descending else "-deliver_time"),
            page_links=_page_links(page, query),
            state_choices=_state_choices(state, query, bookkeeping=bookkeeping),
            actions=actions_for(model, request.user),
            selected_name=SELECTED,
            bulk_operations=_bulk_operations(model, request.user),
            bulk_states=[
                (s, STATE_LABELS.get(s, s.replace("_", "-")))
                for s in FILTER_STATES
                if bookkeeping or s not in ("leased", "failing")
            ],
            text_keys=_text_keys(model),
            stats=stats,
            oldest_age=format_age(stats.oldest_age if stats else None),
            chart=depth_chart(
                recent_samples(model._meta.label, stats),
                width=640,
                height=120,
                series=("total", "ready", "scheduled", "leased") if bookkeeping else ("total",),
            ),
            dead_letter_queue=dead_letter_target(model),
            replays_to=replay_target(model),
            max_attempts_limit=queue_options(model).max_attempts,
            causes=_failure_causes(model),
            pubsub_topic=queue_options(model).pubsub_topic,
            pubsub_subscription=queue_options(model).pubsub_subscription,
        )
        return TemplateResponse(request, "spanner_queues/admin/messages.html", context)

    def _page(
        self,
        request: HttpRequest,
        model: type[Queue],
        state: str,
        term: str,
        *,
        descending: bool,
        now: datetime,
        bookkeeping: bool,
    ) -> Page[Any]:
        """The page of the queue's messages the request asks for, in ``state`` (``""``: any),
        matching ``term``, by deliver time."""
        rows = messages_queryset(model)
        if state:
            rows = rows.filter(state_filter(state, now, bookkeeping=bookkeeping))
        if term:
            rows = rows.filter(search_filter(model, term))
        paginator = Paginator(rows.order_by(*ordering(model, descending)), PER_PAGE)
        page = paginator.get_page(request.GET.get("p"))
        page.object_list = [
            self._row(model, row_to_message(model, row), now) for row in page.object_list
        ]
        return page

    def message_view(self, request: HttpRequest, queue: str, key: str) -> HttpResponse:
        self._require_view(request)
        model = self._queue(queue)
        try:
            found = get_messages(model, [parse_key_token(model, key)])
        except ValueError as exc:
            raise Http404(f"Not a key of {model._meta.label}: {exc}") from exc
        if not found:
            raise Http404(f"No message with this key in {model._meta.label} (acked or moved?).")
        message = found[0]
        context = self._context(
            request,
            str(message),
            **self._queue_context(model),
            row=self._row(model, message, clock.now()),
            key_items=[(name, visible(str(v))) for name, v in message.key_dict.items()],
            payload=render_payload(message.payload),
            actions=actions_for(model, request.user),
            selected_name=SELECTED,
        )
        return TemplateResponse(request, "spanner_queues/admin/message.html", context)

    # --- actions ----------------------------------------------------------------------------
    def action_view(self, request: HttpRequest, queue: str) -> HttpResponse:
        self._require_view(request)  # before the queue is looked up: nothing leaks
        model = self._queue(queue)
        back = HttpResponseRedirect(self._url("messages", model._meta.label_lower))
        if request.method != "POST":
            return back
        action = ACTIONS.get(request.POST.get("action", ""))
        if action is None or not action.available(model):
            messages.warning(request, "No action selected.")
            return back
        if not action.allowed(request.user):
            raise PermissionDenied
        try:
            keys = [parse_key_token(model, t) for t in request.POST.getlist(SELECTED)]
        except ValueError as exc:
            messages.error(request, f"Not a key of {model._meta.label}: {exc}")
            return back
        if not keys:
            messages.warning(
                request,
                "Items must be selected in order to perform actions on them. "
                "No items have been changed.",
            )
            return back
        found = get_messages(model, keys)
        confirmed = request.POST.get("post") == "yes"
        data = request.POST if confirmed else None
        form: forms.Form | None = None
        if action.needs_time:
            form = RescheduleForm(data, initial=_initial_time())
        elif action.needs_reason:
            form = CancelForm(data)
        if confirmed and (form is None or form.is_valid()):
            return self._perform(request, model, action, keys, found, form)
        now = clock.now()
        context = self._context(
            request,
            "Are you sure?",
            **self._queue_context(model),
            action=action,
            rows=[self._row(model, m, now) for m in found],
            missing=len(keys) - len(found),
            form=form,
            selected_name=SELECTED,
        )
        return TemplateResponse(request, "spanner_queues/admin/confirm.html", context)

    def _perform(
        self,
        request: HttpRequest,
        model: type[Queue],
        action: QueueAction,
        keys: list[tuple[Any, ...]],
        found: list[Message],
        form: forms.Form | None,
    ) -> HttpResponse:
        back = HttpResponseRedirect(self._url("messages", model._meta.label_lower))
        if len(found) < len(keys):
            messages.error(
                request,
                f"{len(keys) - len(found)} of the selected messages no longer exist (acked or "
                "moved meanwhile). Nothing was changed.",
            )
            return back
        given = form.cleaned_data if form is not None else {}
        when, reason = given.get("deliver_time"), given.get("reason", "")
        by = request.user.get_username() if hasattr(request.user, "get_username") else ""
        try:
            perform(
                action,
                model,
                found,
                user_id=request.user.pk,
                deliver_time=when,
                reason=reason,
                by=by,
            )
        except QueueError as exc:
            messages.error(request, f"Nothing was changed: {exc}")
            return back
        n = len(found)
        messages.success(
            request,
            f"{action.change_message(model, when, reason)}: {n} message{'s' if n != 1 else ''} of "
            f"{model._meta.label}.",
        )
        return back

    # --- bulk actions -----------------------------------------------------------------------
    def bulk_view(self, request: HttpRequest, queue: str) -> HttpResponse:
        """POST a filter and ``operation``: the confirmation with the preview count; with
        ``post=yes``, the operation on every matching message (``BULK_PER_REQUEST`` per
        request; ``cursor`` resumes). A GET changes nothing."""
        self._require_view(request)  # before the queue is looked up: nothing leaks
        model = self._queue(queue)
        back = HttpResponseRedirect(self._url("messages", model._meta.label_lower))
        if request.method != "POST":
            return back
        operation = request.POST.get("operation", "")
        if operation not in OPERATIONS:
            messages.warning(request, "No bulk action selected.")
            return back
        if not permission_action(operation).allowed(request.user):
            raise PermissionDenied
        targets = move_targets(model)
        try:
            flt = MessageFilter.from_params(model, request.POST.dict())
            cursor = parse_cursor(model, request.POST.get("cursor", ""))
            to = None
            if operation == "move":
                wanted = request.POST.get("to", "")
                default = default_move_target(model)
                to = next((m for m in targets if m._meta.label_lower == wanted.lower()), None)
                to = to or (default if not wanted and default in targets else None)
        except QueueError as exc:
            messages.error(request, f"Nothing was changed: {exc}")
            return back
        confirmed = request.POST.get("post") == "yes"
        form = RescheduleForm(request.POST if confirmed else None, initial=_initial_time())
        if confirmed and (operation != "delay" or form.is_valid()) and (operation != "move" or to):
            when = form.cleaned_data["deliver_time"] if operation == "delay" else None
            result = run_bulk(
                model,
                flt,
                operation,
                user_id=request.user.pk,
                deliver_time=when,
                to=to,
                limit=BULK_PER_REQUEST,
                after=cursor,
            )
            what = describe_operation(operation, when, to)
            done = result.done + _int_param(request, "done")
            skipped = result.skipped + _int_param(request, "skipped")
            summary = (
                f"Bulk {what} on {flt.describe()} in {model._meta.label}: {done} done, {skipped} "
                "skipped (leased or changed since read)"
            )
            if result.error:
                messages.error(request, f"{summary}; stopped: {result.error}")
                return back
            if result.finished:
                messages.success(request, summary + ".")
                return back
            context = self._context(
                request,
                "Bulk action in progress",
                **self._queue_context(model),
                operation=operation,
                operation_label=OPERATION_LABELS[operation],
                what=what,
                filter_text=flt.describe(),
                filter_params=sorted(flt.params().items()),
                done=done,
                skipped=skipped,
                cursor=cursor_token(result.cursor),
                to=to._meta.label_lower if to else "",
                form=form if operation == "delay" else None,
            )
            return TemplateResponse(request, "spanner_queues/admin/bulk.html", context)
        context = self._context(
            request,
            "Are you sure?",
            **self._queue_context(model),
            operation=operation,
            operation_label=OPERATION_LABELS[operation],
            explanation=OPERATION_EXPLANATIONS[operation],
            filter_text=flt.describe(),
            filter_params=sorted(flt.params().items()),
            matching=count_matching(model, flt),
            form=form if operation == "delay" else None,
            targets=[(m._meta.label_lower, m._meta.label) for m in targets],
            to=(
                to or default_move_target(model) or (targets[0] if targets else model)
            )._meta.label_lower,
        )
        return TemplateResponse(request, "spanner_queues/admin/bulk_confirm.html", context)


def _bulk_operations(model: type[Queue], user: object) -> list[tuple[str, str]]:
    """(name, label) of the bulk operations ``user`` may run on ``model``."""
    return [
        (name, OPERATION_LABELS[name])
        for name in OPERATIONS
        if permission_action(name).allowed(user) and (name != "move" or move_targets(model))
    ]


def _text_keys(model: type[Queue]) -> list[str]:
    """The key columns a prefix search applies to (text columns)."""
    found = []
    for name in key_names(model):
        try:
            MessageFilter.from_params(model, {f"prefix.{name}": "x"})
        except QueueError:
            continue
        found.append(name)
    return found


def _state_choices(
    state: str, query: Callable[..., str], *, bookkeeping: bool
) -> list[dict[str, Any]]:
    """The state filter's links: all, then each state the engine shows (``leased`` only
    where rows keep their bookkeeping)."""
    return [
        {"display": "All", "selected": not state, "query": query(state="", p="")},
        *(
            {
                "display": STATE_LABELS[s].capitalize(),
                "selected": state == s,
                "query": query(state=s),
            }
            for s in STATES
            if s != "leased" or bookkeeping
        ),
    ]


def _page_links(page: Any, query: Callable[..., str]) -> list[tuple[str, str]]:
    """(label, query string) for each page link; "" for the current page and for ellipses."""
    if page is None or page.paginator.num_pages < 2:
        return []
    links = []
    for number in page.paginator.get_elided_page_range(page.number, on_each_side=2, on_ends=1):
        current = number == page.number or number == page.paginator.ELLIPSIS
        links.append((str(number), "" if current else query(p=str(number))))
    return links


def _int_param(request: HttpRequest, name: str) -> int:
    """A running total a bulk action's progress page carries (display only: each part's own
    counts are in the admin history)."""
    try:
        return max(0, int(request.POST.get(name, "0")))
    except ValueError:
        return 0


def _failure_causes(model: type[Queue]) -> tuple[str, list[FailureCause]]:
    """The queue's failures by cause, the most recent first; on a dead-letter queue, those of
    the queue its messages came from (the label shown, and the causes; none if unreadable)."""
    label = replay_target(model) or model._meta.label
    try:
        return label, causes_of(label, using=engine_for(get_queue(label)).database)
    except (DatabaseError, QueueError):
        return label, []


def _try_stats(model: type[Queue]) -> QueueStats | None:
    try:
        return engine_for(model).stats(model)
    except (DatabaseError, QueueError):
        return None


def _initial_time() -> dict[str, datetime]:
    now = timezone.localtime(clock.now())
    return {"deliver_time": now.replace(microsecond=0) + timedelta(hours=1)}
