from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.permissions import AllowAny
from rest_framework.routers import DefaultRouter

from channels_app.api.on_demand import OnDemandLoadViewSet
from channels_app.api.views import (
    ChannelViewSet,
    LLMModelViewSet,
    ModelAliasViewSet,
    ModelFileViewSet,
    NodeViewSet,
    PresetViewSet,
)
from channels_app.placement.api import FreeSlotsView, PlacementView
from gateway.api import ApiKeyViewSet, RequestLogViewSet
from gateway.usage.api import UsageView
from portal import audit, sign_in
from portal.password_reset import PublicAddressResetView
from portal.story import api as story_api
from portal.story import page as story_page
from reservations.account_api import MeView, NotificationViewSet, WaitlistViewSet
from reservations.api import ReservationViewSet
from reservations.closures_api import BlackoutViewSet, BulletinViewSet
from reservations.webhooks.api import WebhookViewSet
from slotserve_base.audit_trail import AuditViewSet
from slotserve_site.metrics import metrics_view

router = DefaultRouter()
# The API spells collections with a slash (/api/nodes/) and actions without one
# (/api/reservations/1/approve); accept both everywhere rather than redirect a POST.
router.trailing_slash = "/?"
router.register("nodes", NodeViewSet)
router.register("channels", ChannelViewSet)
router.register("models", LLMModelViewSet)
router.register("presets", PresetViewSet)
router.register("model-aliases", ModelAliasViewSet)
router.register("model-files", ModelFileViewSet, basename="modelfile")
router.register("on-demand-loads", OnDemandLoadViewSet, basename="ondemandload")
router.register("reservations", ReservationViewSet, basename="reservation")
router.register("notifications", NotificationViewSet, basename="notification")
router.register("waitlist", WaitlistViewSet, basename="waitlist")
router.register("blackouts", BlackoutViewSet, basename="blackout")
router.register("bulletins", BulletinViewSet, basename="bulletin")
router.register("keys", ApiKeyViewSet, basename="apikey")
router.register("requests", RequestLogViewSet, basename="requestlog")
router.register("webhooks", WebhookViewSet, basename="webhook")
router.register("audit", AuditViewSet, basename="audit")


def health(request: HttpRequest) -> JsonResponse:
    """Whether this server can do its work: 200 with each dependency "ok", else 503 naming
    the one that is down (for load balancers, Compose and the people reading them)."""
    from slotserve_site.health import check_dependencies

    checks = check_dependencies()
    healthy = all(value == "ok" for value in checks.values())
    status = "ok" if healthy else "unavailable"
    return JsonResponse({"status": status, **checks}, status=200 if healthy else 503)


# Too busy (no database connection in time): 503 with Retry-After; else the usual 500.
handler500 = "slotserve_site.busy.server_error"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/password_reset/", PublicAddressResetView.as_view(), name="password_reset"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("oidc/authenticate/", sign_in.oidc_start, name="oidc_authentication_init"),
    path("oidc/callback/", sign_in.oidc_callback, name="oidc_authentication_callback"),
    # The API's description is no secret: readable before signing in, like the sign-in page.
    path("api/schema/", SpectacularAPIView.as_view(permission_classes=[AllowAny]), name="schema"),
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(url_name="schema", permission_classes=[AllowAny]),
        name="api-docs",
    ),
    path("api/me/", MeView.as_view(), name="me"),
    path("api/placement", PlacementView.as_view(), name="placement"),
    path("api/placement/free-slots", FreeSlotsView.as_view(), name="free_slots"),
    path("api/usage/", UsageView.as_view(), name="usage"),
    path("api/channels/<int:pk>/story", story_api.StoryView.as_view(), name="channel_story_api"),
    path("api/", include(router.urls)),
    path("api-auth/", include("rest_framework.urls")),
    # Programs that ask for the icon without reading a page's <link rel="icon">.
    path("favicon.ico", RedirectView.as_view(url="/static/portal/slotserve.svg", permanent=True)),
    path("audit/", audit.audit_page, name="audit"),
    path("channel/<int:pk>/story", story_page.story_page, name="story"),
    path("audit/csv", audit.audit_csv, name="audit_csv"),
    path("health", health),
    path("metrics", metrics_view),
    path("", include("portal.urls")),
]
