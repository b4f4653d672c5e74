"""SlotServe settings, driven by the environment.

Every SlotServe setting of docs/settings.md is read here with its default, or in the module its
section names (the database, sign-in, the gateway), and a bad value stops start-up naming the
variable (see ``slotserve_base.env``).
"""

from __future__ import annotations

import socket
from pathlib import Path

import django_stubs_ext
from csp.constants import NONCE

from slotserve_base.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_port_range,
    env_seconds_list,
    env_str,
    env_url,
    redis_broker_url,
    secret_key,
)
from slotserve_site.database_settings import databases

# Lets Django's classes be written with their type parameters (``ModelAdmin[Node]``).
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("SLOTSERVE_DATA_DIR", str(BASE_DIR / "data"))).resolve()
# The database (sessions in it), run logs and the secret key live here: its owner's only.
DATA_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
DATA_DIR.chmod(0o700)

DEBUG = env_bool("SLOTSERVE_DEBUG", False)

SECRET_KEY = secret_key(DATA_DIR)
ALLOWED_HOSTS = env_list("SLOTSERVE_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
# The address people open the portal at (e.g. https://gpu.lab.example): links in emails, the calendar
# feed's address and the gateway's base URL on the keys page. Empty: emails carry no link, and pages use
# the address they were opened at.
SLOTSERVE_PUBLIC_URL = env_url("SLOTSERVE_PUBLIC_URL")
CSRF_TRUSTED_ORIGINS = env_list("SLOTSERVE_CSRF_TRUSTED_ORIGINS", [])

# Behind a proxy that ends HTTPS (docs/deploy.md): secure cookies, HSTS, and the proxy's
# X-Forwarded-Proto trusted, so Django knows the request came over HTTPS.
SLOTSERVE_HTTPS = env_bool("SLOTSERVE_HTTPS", False)
if SLOTSERVE_HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("SLOTSERVE_HSTS_SECONDS", 31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = False
    SECURE_SSL_REDIRECT = env_bool("SLOTSERVE_SSL_REDIRECT", True)
    # The node workers and health checks call plain HTTP inside the network.
    SECURE_REDIRECT_EXEMPT = [r"^health$", r"^metrics$"]
SESSION_COOKIE_HTTPONLY = True

INSTALLED_APPS = [
    "daphne",
    "slotserve_site.admin_site.SlotServeAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "axes",
    "auditlog",
    "channels",
    "channels_app",
    "reservations",
    "reservations.webhooks",
    "gateway",
    "portal",
    "slotserve_site",  # the project's own commands: manage.py run
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A body in a charset other than UTF-8 is refused before anything reads it.
    "slotserve_site.middleware.BodyCharsetMiddleware",
    # Static files (the admin's styles, the API docs' Swagger UI) served by SlotServe itself.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "slotserve_site.middleware.UserTimezoneMiddleware",
    "slotserve_site.audit.AuditMiddleware",  # who changed what (docs/architecture.md)
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last, as django-axes asks: it answers a locked-out sign-in.
    "axes.middleware.AxesMiddleware",
]

# --- Content-Security-Policy (django-csp) --------------------------------------- The portal runs no
# third-party script: only its own files and its inline scripts, each with the page's nonce (``nonce="{{
# request.csp_nonce }}"``); the usage charts are SVG drawn by the server. Inline styles stay allowed
# (style attributes carry no script).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'", NONCE],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

# --- Sign-in throttling (django-axes) -----------------------------------------
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out user and address
    "django.contrib.auth.backends.ModelBackend",
]
AXES_ENABLED = env_bool("SLOTSERVE_LOGIN_THROTTLE", True)
AXES_FAILURE_LIMIT = env_int("SLOTSERVE_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = env_float("SLOTSERVE_LOGIN_LOCKOUT_MINUTES", 15, minimum=0.1) / 60  # hours
# One account from one address: a colleague's typos do not lock out the whole lab.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# The address a failure counts against is the socket's, unless it is a proxy named here
# (addresses or networks); then the one that proxy says it was called from. None by default;
# behind HTTPS, the documented nginx on this machine (docs/deploy.md); "none" for none.
SLOTSERVE_TRUSTED_PROXIES = env_networks(
    "SLOTSERVE_TRUSTED_PROXIES", ["127.0.0.1", "::1"] if SLOTSERVE_HTTPS else []
)
AXES_CLIENT_IP_CALLABLE = "slotserve_site.client_address.client_address"

ROOT_URLCONF = "slotserve_site.urls"
WSGI_APPLICATION = "slotserve_site.wsgi.application"
ASGI_APPLICATION = "slotserve_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.context_processors.navigation",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------
# SQLite in the data directory by default; PostgreSQL when DATABASE_URL says so
# (slotserve_site/database_settings.py).
DATABASES = databases(env_str("DATABASE_URL", ""), DATA_DIR)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("SLOTSERVE_TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
# Where `collectstatic` would put them; WhiteNoise looks there too. Private like the rest.
STATIC_ROOT.mkdir(exist_ok=True, mode=0o700)
STATIC_ROOT.chmod(0o700)
# WhiteNoise finds the files in the apps themselves: no collectstatic step is needed.
WHITENOISE_USE_FINDERS = True
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# --- Joining (docs/portal.md, "Joining"): staff invite by email; people sign themselves up only
# where a lab says so: "approval" (anyone may ask; staff approve each once its email is
# confirmed) or "domain" (addresses in SLOTSERVE_SIGNUP_DOMAINS only, active once confirmed).
SLOTSERVE_SIGNUP = env_choice("SLOTSERVE_SIGNUP", "OFF", ("OFF", "APPROVAL", "DOMAIN")).lower()
SLOTSERVE_SIGNUP_DOMAINS = [
    d.strip().lower().lstrip("@") for d in env_list("SLOTSERVE_SIGNUP_DOMAINS", []) if d.strip()
]
SLOTSERVE_INVITATION_DAYS = env_int("SLOTSERVE_INVITATION_DAYS", 7, minimum=1)

# --- Sign-in with the team's own accounts: LDAP and OpenID Connect, each on when configured. Local
# accounts keep working. Directory groups become SlotServe groups (Django groups of the same name) at each
# sign-in; one directory group may make staff.
SLOTSERVE_LDAP_URL = env_str("SLOTSERVE_LDAP_URL", "")
SLOTSERVE_LDAP_NAME = env_str("SLOTSERVE_LDAP_NAME", "your directory account")
if SLOTSERVE_LDAP_URL:
    from slotserve_site.sign_in_settings import ldap_settings_from_env

    globals().update(ldap_settings_from_env(SLOTSERVE_LDAP_URL))
    AUTHENTICATION_BACKENDS.insert(1, "django_auth_ldap.backend.LDAPBackend")

from slotserve_site.sign_in_settings import oidc_settings_from_env  # noqa: E402 (the section's own)

_oidc = oidc_settings_from_env()
globals().update(_oidc)  # mozilla-django-oidc's OIDC_* settings
SLOTSERVE_OIDC_CLIENT_ID = env_str("SLOTSERVE_OIDC_CLIENT_ID", "")
SLOTSERVE_OIDC_NAME: str = _oidc["SLOTSERVE_OIDC_NAME"]
SLOTSERVE_OIDC_GROUPS_CLAIM: str = _oidc["SLOTSERVE_OIDC_GROUPS_CLAIM"]
SLOTSERVE_OIDC_STAFF_GROUP: str = _oidc["SLOTSERVE_OIDC_STAFF_GROUP"]
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
LOGIN_REDIRECT_URL_FAILURE = "/accounts/login/?sign_in_failed=1"
if SLOTSERVE_OIDC_CLIENT_ID:
    AUTHENTICATION_BACKENDS.append("portal.sign_in.DirectoryOIDCBackend")

# --- Email: printed to the console unless an SMTP server is configured ------
EMAIL_HOST = env_str("SLOTSERVE_EMAIL_HOST", "")
EMAIL_BACKEND = (
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend"
)
EMAIL_PORT = env_int("SLOTSERVE_EMAIL_PORT", 587, minimum=1)
EMAIL_HOST_USER = env_str("SLOTSERVE_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = env_str("SLOTSERVE_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env_bool("SLOTSERVE_EMAIL_USE_TLS", True)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = env_str("SLOTSERVE_EMAIL_FROM", "SlotServe <slotserve@localhost>")

# --- Redis, Celery, Channels ----------------------------------------------
REDIS_URL = env_str("SLOTSERVE_REDIS_URL", "redis://127.0.0.1:6379/0")
# Prefix of SlotServe's own Redis keys, so installations can share one Redis.
SLOTSERVE_REDIS_PREFIX = env_str("SLOTSERVE_REDIS_PREFIX", "slotserve")

# Kombu names a Redis socket its own way: unix://:pw@/path?db=0 is redis+socket://:pw@/path.
CELERY_BROKER_URL = redis_broker_url(REDIS_URL)
# Queues carry the installation's prefix too: two installations on one Redis never take each
# other's tasks. Node queues are "<prefix>.node.<name>" (slotserve_base.dispatch.node_queue).
CELERY_TASK_DEFAULT_QUEUE = f"{SLOTSERVE_REDIS_PREFIX}.scheduler"
# The decisions and the webhooks' deliveries have queues of their own (docs/scheduling.md).
CELERY_TASK_ROUTES = ("slotserve_base.dispatch.route",)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TASK_ALWAYS_EAGER = env_bool("SLOTSERVE_CELERY_EAGER", False)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# No task runs forever: each declares tighter limits of its own where it can.
CELERY_TASK_SOFT_TIME_LIMIT = 120
CELERY_TASK_TIME_LIMIT = 180

# The live overview: node workers and the scheduler push changes through Redis, read with a timeout well
# above the layer's 5 s blocking pop (redis-py's default is 5 s too: a quiet page's socket closed with a
# TimeoutError, its pushes lost).
_LAYER_HOST = {"address": REDIS_URL, "socket_timeout": 30}
_LAYER = {"hosts": [_LAYER_HOST], "prefix": f"{SLOTSERVE_REDIS_PREFIX}:layer"}
CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": _LAYER}}

# --- REST API ---------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "gateway.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON only: every answer, errors included, is JSON whatever the client accepts (docs/api.md).
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON as DRF reads it, less what no database stores (slotserve_base.json_text); and forms.
    "DEFAULT_PARSER_CLASSES": [
        "slotserve_site.api_parsers.CheckedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    # Lists filter with django-filter (a bad value is a 400 naming it) and end: a list of at most
    # 100 with Link and X-Total-Count headers; ?limit=&offset= gives {count, next, previous,
    # results} (slotserve_site.api_pages, docs/api.md).
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "slotserve_site.api_pages.ListPages",
    "EXCEPTION_HANDLER": "slotserve_site.api_errors.exception_handler",
    "DATETIME_FORMAT": "iso-8601",
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "slotserve_site.api_errors.JsonWhateverIsAccepted",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "SlotServe API",
    "DESCRIPTION": "Book GPU channels; see what each channel runs and why.",
    "VERSION": "1",
    # Served from this installation: the portal must work without the internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- SlotServe (docs/settings.md) -------------------------------------------
SLOTSERVE_TICK_SECONDS = env_int("SLOTSERVE_TICK_SECONDS", 5, minimum=1)
SLOTSERVE_MIN_PRELOAD_SECONDS = env_float("SLOTSERVE_MIN_PRELOAD_SECONDS", 180)
SLOTSERVE_SWITCH_BUFFER_SECONDS = env_float("SLOTSERVE_SWITCH_BUFFER_SECONDS", 60)
SLOTSERVE_DISK_READ_MBPS = env_float("SLOTSERVE_DISK_READ_MBPS", 200, minimum=0.001)
SLOTSERVE_LOAD_TIMEOUT_SECONDS = env_float("SLOTSERVE_LOAD_TIMEOUT_SECONDS", 600, minimum=1)
SLOTSERVE_STOP_TIMEOUT_SECONDS = env_float("SLOTSERVE_STOP_TIMEOUT_SECONDS", 15)
SLOTSERVE_DRAIN_SECONDS = env_float("SLOTSERVE_DRAIN_SECONDS", 30)
# Prewarm (docs/node-workers.md): how far ahead a node reads a booking's model file, how fast.
SLOTSERVE_PREWARM_SECONDS = env_float("SLOTSERVE_PREWARM_SECONDS", 1800)
SLOTSERVE_PREWARM_MBPS = env_float("SLOTSERVE_PREWARM_MBPS", 1000)
# Warm handovers, off unless asked (docs/scheduling.md, "Sleep and wake").
SLOTSERVE_SLEEP_MODE = env_bool("SLOTSERVE_SLEEP_MODE", False)
# Run logs a node keeps per channel (DATA_DIR/runs/<channel>); older ones go as a run starts.
SLOTSERVE_RUN_LOGS_KEPT = env_int("SLOTSERVE_RUN_LOGS_KEPT", 20, minimum=1)

# Node workers (one per GPU machine).
SLOTSERVE_NODE_NAME = env_str("SLOTSERVE_NODE_NAME", socket.gethostname())
# Checked when the apps are ready (channels_app.apps): settings import no app code.
SLOTSERVE_FAKE_GPUS = env_str("SLOTSERVE_FAKE_GPUS", "")
SLOTSERVE_PROCESS_HOST = env_str("SLOTSERVE_PROCESS_HOST", "127.0.0.1")
# One range to open in a firewall, below Linux's ephemeral range (docs/settings.md).
SLOTSERVE_PROCESS_PORTS = env_port_range("SLOTSERVE_PROCESS_PORTS", "31000-31999")
# More environment variables an inference process may inherit (docs/security.md).
SLOTSERVE_PROCESS_ENV = env_list("SLOTSERVE_PROCESS_ENV", [])
SLOTSERVE_MODEL_DIRS = env_list("SLOTSERVE_MODEL_DIRS", [])

# Placement, booking limits and loads on demand (slotserve_site.placement_settings).
# The gateway's own: how it holds, limits and queues requests (slotserve_site.gateway_settings).
from slotserve_site.gateway_settings import *  # noqa: E402, F403
from slotserve_site.placement_settings import *  # noqa: E402, F403

# Prometheus: /metrics is open unless a token is set.
SLOTSERVE_METRICS_TOKEN = env_str("SLOTSERVE_METRICS_TOKEN", "")

# Days the request log, the audit trail and the channels' stories keep their rows.
SLOTSERVE_REQUEST_LOG_DAYS = env_int("SLOTSERVE_REQUEST_LOG_DAYS", 90, minimum=1)
SLOTSERVE_AUDIT_DAYS = env_int("SLOTSERVE_AUDIT_DAYS", 365, minimum=1)
SLOTSERVE_STORY_DAYS = env_int("SLOTSERVE_STORY_DAYS", 90, minimum=1)
AUDITLOG_DISABLE_REMOTE_ADDR = True  # as the request log: no addresses kept
# More request-log rows than this past the roll-ups' mark at once (a restore, an import) are a
# backlog: folded in the background, in hour order, never inside a page or a flush.
SLOTSERVE_USAGE_BACKLOG_ROWS = env_int("SLOTSERVE_USAGE_BACKLOG_ROWS", 50_000, minimum=1)
# Webhooks (docs/webhooks.md). Networks a webhook's URL may point into besides the public
# internet: none by default, so that no webhook reaches this machine's own Redis, database or
# inference processes; e.g. "10.20.0.0/16" for a chat server on the lab's network.
SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS = env_networks("SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS", [])
# Seconds to wait before each retry of a failed delivery; after the last the webhook is paused.
# The default spreads nine tries over about a day. The timeout: seconds a receiver has to answer.
SLOTSERVE_WEBHOOK_RETRY_SECONDS = env_seconds_list(
    "SLOTSERVE_WEBHOOK_RETRY_SECONDS", [5.0, 60.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 21600.0]
)
SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS = env_float("SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS", 10.0, minimum=0.5)
# Days the delivery log keeps events and their tries.
SLOTSERVE_WEBHOOK_LOG_DAYS = env_int("SLOTSERVE_WEBHOOK_LOG_DAYS", 30, minimum=1)
# Web processes `manage.py run` starts (pages, API and gateway; each with its own snapshot, all
# sharing Redis). 0: one per CPU core, at most 4, on PostgreSQL; one on SQLite (one writer at a
# time). bench/portal_load.py measured what more give (docs/benchmarks.md).
SLOTSERVE_WEB_PROCESSES = env_int("SLOTSERVE_WEB_PROCESSES", 0, minimum=0)
# Seconds the web server keeps a client's idle connection open. Longer than a person's pause
# between pages and than a load balancer's idle timeout (60 s is common): a client, or a balancer,
# that reuses a connection the server is closing at that moment sees it reset.
SLOTSERVE_KEEP_ALIVE_SECONDS = env_float("SLOTSERVE_KEEP_ALIVE_SECONDS", 65.0, minimum=1.0)

# Backend executables (docs/api.md, "Backend programs").
SLOTSERVE_LLAMA_SERVER = env_str("SLOTSERVE_LLAMA_SERVER", "llama-server")
SLOTSERVE_VLLM = env_str("SLOTSERVE_VLLM", "vllm")
SLOTSERVE_SGLANG = env_str("SLOTSERVE_SGLANG", "python -m sglang.launch_server")

# SlotServe's own logs; the lines for each run of the tasks that run every few seconds show only
# at DEBUG (slotserve_site.celery).
SLOTSERVE_LOG_LEVEL = env_choice(
    "SLOTSERVE_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": SLOTSERVE_LOG_LEVEL},
    # One line per proxied request would cost the gateway more than the proxying.
    "loggers": {
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
        "axes": {"level": "WARNING"},  # a line per sign-in otherwise; lockouts still show
    },
}
