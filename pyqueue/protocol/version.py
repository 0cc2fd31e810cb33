"""The installed distribution's version (``pyqueue.__version__``), read once."""

from importlib.metadata import PackageNotFoundError, version

#: The name on the package index (``pip install pyqueue-redis``); the import name is ``pyqueue``.
DISTRIBUTION = "pyqueue-redis"

try:
    VERSION = version(DISTRIBUTION)
except PackageNotFoundError:  # running from a checkout that was never installed
    VERSION = "0+unknown"
