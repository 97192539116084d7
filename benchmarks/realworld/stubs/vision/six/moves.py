import urllib  # noqa: F401
import urllib.request  # noqa: F401
