"""The route table: every operation of the API, in the order of the OpenAPI document."""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from starlette.responses import Response

from contextlog.producers.history import SessionInfo
from contextlog.schema.notices import Notice
from contextlog.worker.api import admin, conversations, notifications, recall, sessions
from contextlog.worker.api import models as m
from contextlog.worker.api.app import JSON, Call
from contextlog.worker.api.spec import Endpoint, document, dumps
from contextlog.worker.app.status import Status
from contextlog.worker.store.archive import ExportedSession

CONV: Final = "/v1/agents/{agent}/channels/{channel}"
SESSION: Final = CONV + "/sessions/{session_id}"
WEBHOOK: Final = "/v1/webhooks/{webhook_id}"


async def openapi(call: Call) -> Response:
    """This API's OpenAPI 3.1 document (no key needed)."""
    return Response(_document(), media_type=JSON)


@cache
def _document() -> bytes:
    return dumps(openapi_document())


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of `ENDPOINTS` (with the Notice its event stream carries)."""
    return document(ENDPOINTS, extra=(Notice,))


ENDPOINTS: Final = (
    # conversations: what a bot does on every turn
    Endpoint("POST", CONV + "/messages", "postMessage", conversations.post_message,
             "Post a message", "conversations", "post", body=m.MessageIn,
             response=m.Accepted, status=202, idempotent=True),
    Endpoint("POST", "/v1/batch", "postBatch", conversations.post_batch,
             "Post messages and commands in one request", "conversations", "post",
             body=m.BatchIn, response=m.BatchAccepted, status=202, idempotent=True),
    Endpoint("POST", CONV + "/turn", "turn", conversations.turn,
             "Post a message and read the request it ends", "conversations", "post",
             body=m.TurnIn, response=m.TurnOut, idempotent=True),
    Endpoint("GET", CONV + "/context", "getContext", conversations.context,
             "Read a thread's context", "conversations", "read", query=m.ContextQuery,
             response=m.ContextOut),
    Endpoint("POST", CONV + "/context/request", "contextRequest", conversations.request,
             "Read a thread's context as a messages.create request", "conversations",
             "read", body=m.RequestIn, response=m.RequestOut),
    Endpoint("POST", CONV + "/clear", "clear", conversations.clear, "Clear the context",
             "conversations", "post", body=m.ClearIn, response=m.Accepted, status=202,
             idempotent=True),
    Endpoint("GET", CONV + "/settings", "getSettings", conversations.settings,
             "Read the conversation's settings", "conversations", "read",
             response=m.SettingsOut),
    Endpoint("PATCH", CONV + "/settings", "configure", conversations.configure,
             "Change the conversation's settings", "conversations", "post",
             body=m.SettingsIn, response=m.Accepted, status=202, idempotent=True),
    Endpoint("PUT", CONV + "/frame", "setFrame", conversations.set_frame,
             "Register the bot's request frame", "conversations", "post",
             body=m.FrameIn, response=m.Accepted, status=202, idempotent=True),
    Endpoint("PUT", CONV + "/retention", "setRetention", conversations.set_retention,
             "Set the conversation's retention", "conversations", "admin",
             body=m.RetentionIn, response=m.Accepted, status=202, idempotent=True),
    # an agent's memory as a whole
    Endpoint("GET", "/v1/agents/{agent}/search", "search", recall.search,
             "Search the agent's conversations", "recall", "read", query=m.SearchQuery,
             response=m.SearchOut, refusable=True),
    Endpoint("POST", "/v1/agents/{agent}/erase", "erase", recall.erase,
             "Erase a sender, a conversation or a session", "recall", "admin",
             body=m.EraseIn, response=m.BatchAccepted, status=202),
    # saved sessions
    Endpoint("GET", "/v1/agents/{agent}/sessions", "listSessions", sessions.list_sessions,
             "List saved sessions", "sessions", "sessions", query=m.PageQuery,
             response=m.SessionPageOut),
    Endpoint("POST", CONV + "/sessions", "saveSession", sessions.save, "Save the context",
             "sessions", "sessions", body=m.SaveIn, response=m.Accepted, status=202,
             idempotent=True),
    Endpoint("POST", CONV + "/sessions/import", "importSession", sessions.import_session,
             "Import an exported session", "sessions", "sessions", body=ExportedSession,
             query=m.ImportQuery, response=m.Accepted, status=202, refusable=True,
             large=True),
    Endpoint("POST", CONV + "/sessions/purge", "purgeSessions", sessions.purge,
             "Keep only the newest sessions", "sessions", "sessions", body=m.PurgeIn,
             response=m.Accepted, status=202, idempotent=True),
    Endpoint("GET", SESSION, "getSession", sessions.show_session, "Show a saved session",
             "sessions", "sessions", response=SessionInfo, refusable=True),
    Endpoint("DELETE", SESSION, "deleteSession", sessions.delete_session,
             "Delete a saved session", "sessions", "sessions", body=m.ClearIn,
             response=m.Accepted, status=202, idempotent=True),
    Endpoint("POST", SESSION + "/restore", "restoreSession", sessions.restore,
             "Restore a saved session", "sessions", "sessions", body=m.ClearIn,
             response=m.Accepted, status=202, idempotent=True),
    Endpoint("GET", SESSION + "/export", "exportSession", sessions.export,
             "Export a saved session", "sessions", "sessions", response=ExportedSession,
             refusable=True),
    # notifications
    Endpoint("GET", "/v1/agents/{agent}/notifications", "streamNotifications",
             notifications.stream, "Follow notifications (server-sent events)",
             "notifications", "read", query=m.NotifyQuery, stream=True, agent_wide=True),
    Endpoint("POST", "/v1/agents/{agent}/notifications/ack", "ackNotifications",
             notifications.ack, "Acknowledge notifications", "notifications", "read",
             body=m.AckIn, response=m.Acked, agent_wide=True),
    # the deployment
    Endpoint("GET", "/v1/health", "health", admin.health, "Health", "admin", None,
             response=m.Health),
    Endpoint("GET", "/v1/status", "status", admin.status, "Status", "admin", "admin",
             response=Status),
    Endpoint("GET", "/v1/openapi.json", "openapi", openapi, "This document", "admin", None),
    Endpoint("POST", "/v1/webhooks", "createWebhook", admin.create_webhook,
             "Register a webhook", "webhooks", "admin", body=m.WebhookIn,
             response=m.WebhookOut, status=201),
    Endpoint("GET", "/v1/webhooks", "listWebhooks", admin.list_webhooks, "List webhooks",
             "webhooks", "admin", response=m.WebhookList),
    Endpoint("DELETE", WEBHOOK, "deleteWebhook", admin.delete_webhook, "Delete a webhook",
             "webhooks", "admin", status=204, findable=True),
    Endpoint("GET", WEBHOOK + "/deliveries", "listDeliveries", admin.list_deliveries,
             "List a webhook's deliveries", "webhooks", "admin", query=m.DeliveryQuery,
             response=m.DeliveryList, findable=True),
    Endpoint("POST", WEBHOOK + "/deliveries/{delivery_id}/replay", "replayDelivery",
             admin.replay_delivery, "Send a delivery again", "webhooks", "admin",
             response=m.Replayed, status=202, findable=True),
)  # fmt: skip
