"""Settings of the Django example: a shop whose orders send receipts as tasks."""
import os
from pathlib import Path

import django

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "mysite.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_DB", BASE_DIR / "db.sqlite3"),
    }
}

INSTALLED_APPS = [
    "shop",
    "pyqueue.contrib.django",          # manage.py pyqueue_worker, and the checks
]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")   # the backport of django.tasks (pip install django-tasks)

TASKS = {
    "default": {
        "BACKEND": "pyqueue.contrib.django.PyQueueBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "url": os.environ.get("PYQUEUE_URL", "redis://127.0.0.1:6379/0"),
            "max_attempts": 3,             # a task that raises runs up to 3 times
        },
    }
}
